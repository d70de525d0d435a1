"""What the agent does with its host once the attempt has ended: terminate it (an instance that
served one run), keep it until nobody was attached for a while (`aws.keep_alive`), or leave it
(the local machine)."""

from __future__ import annotations

import logging
import time

from . import tmux
from .wait import retry_until

log = logging.getLogger("orch.agent")


class HostPolicy:
    def __init__(self, session: str, terminate_on_exit: bool, idle_s: float):
        self.session, self.terminate_on_exit, self.idle_s = session, terminate_on_exit, idle_s

    def after_attempt(self) -> None:
        if self.terminate_on_exit:
            self._terminate()
        elif self.idle_s:
            self._linger()

    def _linger(self) -> None:
        """keep_alive: stay for whoever attaches; once nobody was attached for idle_s, terminate."""
        last_seen = [time.time()]

        def idle_enough() -> bool:
            if tmux.clients(self.session):
                last_seen[0] = time.time()
            return time.time() - last_seen[0] >= self.idle_s

        log.info("run ended; keeping this instance until nobody was attached for %.0f s", self.idle_s)
        retry_until(idle_enough, timeout=None, interval=min(10.0, self.idle_s / 3))
        self._terminate()

    def _terminate(self) -> None:
        """The run is over and nothing else needs this machine: stop paying for it."""
        from .imds import terminate_self

        try:
            log.info("run ended; terminating this instance %s", terminate_self())
        except Exception as exc:  # the safety-net shutdown and `orch down` still catch it
            log.error("could not terminate this instance: %s", exc)
