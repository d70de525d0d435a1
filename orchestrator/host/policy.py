"""What the agent does with its host once the attempt has ended: terminate it (an instance that
served one run, or the last run of a packed instance), keep it until nobody was attached for a
while (`aws.keep_alive`), leave it to the other runs that share it (packing), or leave it (the
local machine)."""

from __future__ import annotations

import logging
import time

from orchestrator.host import tmux
from orchestrator.wait import retry_until

log = logging.getLogger("orch.agent")


class HostPolicy:
    def __init__(self, session: str, terminate_on_exit: bool, idle_s: float, slot: int = -1, slot_value: str = ""):
        self.session, self.terminate_on_exit, self.idle_s = session, terminate_on_exit, idle_s
        self.slot, self.slot_value = (
            slot,
            slot_value,
        )  # a packed instance: this run's slot (-1: the host is the run's alone)

    def after_attempt(self) -> None:
        if self.slot >= 0 and not self._leave_slot():
            return  # other runs still use this instance: it stays theirs
        if self.terminate_on_exit:
            self._terminate()
        elif self.idle_s:
            self._linger()

    def _leave_slot(self) -> bool:
        """Give the slot back (tag and host register); True when this was the instance's last run."""
        from orchestrator.host.aws.slots import leave, untag

        try:
            untag(self.slot, self.slot_value)
        except Exception as exc:  # the controller removes a stale slot tag when it releases the slot
            log.warning("could not remove this run's slot tag: %s", exc)
        last = leave(self.slot, self.slot_value)
        log.info(
            "slot %s released; %s",
            self.slot,
            "the last run on this instance" if last else "other runs still use this instance",
        )
        return last

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
        from orchestrator.host.aws.imds import own_instance_id, terminate_self

        try:  # logged first: the instance (this process with it) may be gone before the call returns
            instance_id = own_instance_id()
            log.info("run ended; terminating this instance %s", instance_id)
            terminate_self(instance_id)
        except Exception as exc:  # the safety-net shutdown and `orch down` still catch it
            log.error("could not terminate this instance: %s", exc)
