"""The remote controller's supervisor (`orch launch --remote`): what runs on the controller's instance.

It starts the sweep's controller (`orch _controller SWEEP --remote-settings remote.json`) as a child, copies its
log into the store (`<sweep>/controller.log`, for `orch logs --controller` from anywhere), and restarts it when it
dies. It ends — and has its own instance terminated, by the function its backend gives (on AWS the EC2 API: its
instance role may terminate what carries its sweep's tag) — when the controller is done (every run final, or
stopped by `orch down` through the lease), when the controller is refused (exit 2: another controller holds the
sweep, or the sweep itself is wrong), after MAX_RESTARTS crashes, or at the `max_hours` deadline (the safety net;
the instance's per-boot shutdown script is a second one).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.backends.registry import load_sweep
from orchestrator.control import notify
from orchestrator.control.lease import INSTANCE_ENV, SUPERVISOR_ENV
from orchestrator.control.notify_events import controller_message
from orchestrator.store import layout
from orchestrator.store.base import Store
from orchestrator.wait import retry_until

log = logging.getLogger("orch.supervisor")

MAX_RESTARTS = 5
TERMINATE_TRIES = 5  # a refused TerminateInstances, 10 s apart
UPLOAD_S = 10.0  # the log in the store at most this late
LOG_TAIL = 1 << 20  # the store keeps the log's last MiB
GONE = "the controller died"
DONE, REFUSED = 0, 2  # the controller's exit codes that end the supervisor (2: expected errors, see cli/common.py)


class Settings(Protocol):
    """What the supervisor reads of its backend's remote settings (remote.json on the controller's instance)."""

    sweep_file: str  # the sweep file on the instance; remote.json lies beside it
    code_dir: str  # orch's code on the instance (PYTHONPATH)
    instance_id: str
    instance_type: str
    region: str
    deadline: float  # epoch seconds: the supervisor ends (and its instance with it) then
    notify_env: dict[str, str]  # `notify:`'s url_env sinks, as the laptop had them


@dataclass
class Ending:
    reason: str
    restarts: int


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        sweep: str,
        store: Store,
        log_path: Path,
        terminate: Callable[[str], None],
        now: Callable[[], float] = time.time,
        prepare: Callable[[], None] = lambda: None,
    ):
        """`terminate` ends an instance by its id; `prepare` readies the instance before the first controller
        starts (on AWS: the controller's own SSH key)."""
        self.s, self.sweep, self.store, self.log_path = settings, sweep, store, log_path
        self.terminate, self.now, self.prepare = terminate, now, prepare
        self.restarts = 0
        self._uploaded = 0.0
        # its controllers' leases name it: a restart takes the dead one's over at once. The instance's id, so that a
        # supervisor restarted by systemd (which stopped the old one's controller with it) is the same supervisor
        self.token = settings.instance_id or uuid.uuid4().hex

    def run(self) -> Ending:
        """Supervise until the sweep no longer needs this instance, then terminate it."""
        self.prepare()
        os.environ.update(self.s.notify_env)  # `notify:`'s url_env sinks, for its own messages and the controller's
        ending = retry_until(self._one_life, None, 1.0)
        self._note(f"supervisor: {ending.reason}; terminating this instance ({self.s.instance_id})")
        if ending.reason.startswith(GONE):  # the controller will not come back: its user is told why
            self._tell(
                "gone", f"{ending.reason}. The sweep has no controller now; `orch launch --remote` continues it."
            )
        self.upload(force=True)
        self._terminate()
        return ending

    def _terminate(self, tries: int = TERMINATE_TRIES) -> None:
        """Terminate this instance; a refusal is logged and tried again (the watchdog goes on trying after)."""
        for n in range(1, tries + 1):
            try:
                self.terminate(self.s.instance_id)
                return
            except Exception as exc:
                self._note(f"supervisor: terminating this instance was refused ({n} of {tries}): {exc}")
                self.upload(force=True)
            if n < tries:
                time.sleep(10.0)
        self._note("supervisor: giving up; the watchdog keeps trying to end this instance")
        self.upload(force=True)

    def _one_life(self) -> Ending | None:
        """One run of the controller; an Ending when the supervisor should stop, None to start it again."""
        if self.now() >= self.s.deadline:
            return Ending("max_hours reached before the sweep ended", self.restarts)
        proc = self._start()
        code = self._wait(proc)
        if code is None:
            proc.terminate()
            return Ending("max_hours reached: the controller was stopped", self.restarts)
        if code == DONE:
            return Ending("the controller ended (every run final, or stopped through its lease)", self.restarts)
        if code == REFUSED:
            return Ending("the controller was refused (exit 2, see the log above)", self.restarts)
        self.restarts += 1
        if self.restarts > MAX_RESTARTS:
            return Ending(f"{GONE} {self.restarts} times (last exit code {code})", self.restarts)
        self._note(f"supervisor: the controller exited with code {code}; restart {self.restarts} of {MAX_RESTARTS}")
        self._tell(f"restart:{self.restarts}", f"the controller exited with code {code}; restarted by its supervisor "
                   f"({self.restarts} of {MAX_RESTARTS}). See `orch logs --controller {self.sweep}`.")  # fmt: skip
        time.sleep(min(60.0, 5.0 * self.restarts))
        return None

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ, PYTHONPATH=self.s.code_dir)
        env.update(zip(INSTANCE_ENV, (self.s.instance_id, self.s.instance_type, self.s.region)))
        env[SUPERVISOR_ENV] = self.token
        argv = [sys.executable, "-m", "orchestrator.cli", "_controller", self.s.sweep_file, "--remote-settings"]
        argv.append(str(Path(self.s.sweep_file).with_name("remote.json")))
        out = open(self.log_path, "ab")
        try:
            return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()

    def _wait(self, proc: subprocess.Popen) -> int | None:
        """The child's exit code; None when the deadline came first. The log goes to the store meanwhile."""

        def ended():
            self.upload()
            if self.now() >= self.s.deadline:
                return "deadline"
            return "exited" if proc.poll() is not None else None

        why = retry_until(ended, None, 1.0)
        return None if why == "deadline" else proc.returncode

    def upload(self, force: bool = False) -> None:
        if not force and self.now() - self._uploaded < UPLOAD_S:
            return
        try:
            data = self.log_path.read_bytes()[-LOG_TAIL:] if self.log_path.exists() else b""
            self.store.put_bytes(layout.controller_log_key(self.sweep), data)
            self._uploaded = self.now()
        except OSError as exc:  # the store is out of reach for a moment: the next upload tries again
            log.warning("could not upload the controller's log: %s", exc)

    def _tell(self, key: str, text: str) -> None:
        """A `controller` notification (`notify:`), sent now; a failure to tell never stops the supervisor."""
        try:
            sweep = load_sweep(self.s.sweep_file)
            notify.tell_now(self.store, sweep, controller_message(self.sweep, key, text))
        except Exception as exc:
            log.warning("could not send the controller notification: %s", exc)

    def _note(self, text: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
