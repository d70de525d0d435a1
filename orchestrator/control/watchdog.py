"""The remote controller's watchdog (`orch launch --remote`): ends its instance once nothing needs it, whatever died.

The supervisor terminates its instance when the sweep ends; but a supervisor killed for memory, a reboot, or a
refused TerminateInstances left the instance billing until `max_hours` (48 h by default). The watchdog is a
process of its own (a systemd unit beside the supervisor's, see backends/aws/remote_units.py) that reads only the
sweep's lease in the store, once a minute, and terminates its own instance when:

- the lease this instance held was released for good (`final`: every run final, or stopped by `orch down`) more
  than ENDED_GRACE_S ago (the supervisor's own termination, with its last log upload, goes first), or lapsed (no
  controller renewed it, or took it after a crash's release, for the lease's `stale_after_s`: the controller and
  its supervisor are gone), or was taken by another controller;
- this instance never held the lease START_GRACE_S after the watchdog started (the launch failed half-way);
- `max_hours` passed (the supervisor's deadline) by DEADLINE_GRACE_S.

A refused termination is logged and tried again each period; after SHUTDOWN_AFTER refusals it also shuts the
instance down (its shutdown behaviour is `terminate`: EC2 terminates it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from orchestrator.control.lease import LeaseRecord, read_lease
from orchestrator.store import layout
from orchestrator.store.base import Store

log = logging.getLogger("orch.watchdog")

WATCH_S = 60.0  # one GET of the lease a minute: 1,440 a day (under $0.001 on S3)
ENDED_GRACE_S = 120.0
START_GRACE_S = 900.0  # as the laptop's STARTING_S (cli/remote.py): the install and the first pass fit in it
DEADLINE_GRACE_S = 300.0
SHUTDOWN_AFTER = 3


class Settings(Protocol):
    """What the watchdog reads of its backend's remote settings (the backend's RemoteSettings has it)."""

    instance_id: str
    deadline: float  # epoch seconds: max_hours, the supervisor's deadline


def verdict(lease: LeaseRecord | None, me: str, held: bool, now: float, started: float, deadline: float) -> str:
    """Why this instance should end now ('' while it is needed). `held`: this instance held the lease before."""
    if now >= deadline + DEADLINE_GRACE_S:
        return "max_hours passed and the instance still runs"
    ours = lease is not None and lease.holder.instance_id == me
    if not ours:
        if held:
            return "another controller took the sweep's lease over"
        if now - started >= START_GRACE_S:
            return f"this instance's controller never took the sweep's lease in {START_GRACE_S:.0f} s"
        return ""
    assert lease is not None
    if lease.ended is not None and lease.final:
        if now - lease.ended >= ENDED_GRACE_S:
            return f"the sweep's lease ended {now - lease.ended:.0f} s ago ({lease.end_reason or 'no reason given'})"
        return ""
    # held, or released by a controller that did not end the sweep (a crash): the supervisor's next controller takes
    # it within a minute. A watchdog that just started (after a reboot) leaves that controller time to come.
    silent = now - (lease.ended if lease.ended is not None else lease.heartbeat)
    if silent > lease.stale_after_s and now - started > lease.stale_after_s:
        return f"the sweep's lease lapsed: no controller for {silent:.0f} s (it and its supervisor are gone)"
    return ""


class Watchdog:
    def __init__(
        self,
        settings: Settings,
        sweep: str,
        store: Store,
        log_path: Path,
        terminate: Callable[[str], None],
        shutdown: Callable[[], None],
        now: Callable[[], float] = time.time,
    ):
        self.s, self.sweep, self.store, self.log_path = settings, sweep, store, log_path
        self.terminate, self.shutdown, self.now = terminate, shutdown, now
        self.started = now()
        self.held = False
        self.refusals = 0

    def check(self) -> str:
        """One look at the lease; the reason this instance was asked to end ('' when it is still needed)."""
        try:
            lease, _ = read_lease(self.store, self.sweep)
        except Exception as exc:  # the store out of reach for a moment; max_hours still applies below
            log.warning("watchdog: could not read the lease: %s", exc)
            lease = None if self.now() >= self.s.deadline + DEADLINE_GRACE_S else _UNKNOWN
        if lease is _UNKNOWN:
            return ""
        why = verdict(lease, self.s.instance_id, self.held, self.now(), self.started, self.s.deadline)
        self.held = self.held or (lease is not None and lease.holder.instance_id == self.s.instance_id)
        if why:
            self._end(why)
        return why

    def _end(self, why: str) -> None:
        self._note(f"watchdog: {why}; terminating this instance ({self.s.instance_id})")
        self._upload()
        try:
            self.terminate(self.s.instance_id)
            return
        except Exception as exc:
            self.refusals += 1
            self._note(f"watchdog: terminating this instance was refused ({self.refusals}): {exc}")
        if self.refusals >= SHUTDOWN_AFTER:
            self._note("watchdog: shutting the instance down instead (its shutdown behaviour terminates it)")
            self._upload()
            try:
                self.shutdown()
            except Exception as exc:
                self._note(f"watchdog: the shutdown failed too: {exc}; trying again in {WATCH_S:.0f} s")

    def run(self, period: float = WATCH_S) -> None:
        """Look every `period` seconds, for as long as the instance lives."""
        self._note(f"watchdog: watching the lease of sweep {self.sweep} every {period:.0f} s")
        while True:
            self.check()
            time.sleep(period)

    def _upload(self) -> None:
        """The shared log (the supervisor's) into the store, so `orch logs --controller` says why the instance ended."""
        try:
            data = self.log_path.read_bytes()[-(1 << 20) :] if self.log_path.exists() else b""
            self.store.put_bytes(layout.controller_log_key(self.sweep), data)
        except Exception as exc:
            log.warning("watchdog: could not upload the log: %s", exc)

    def _note(self, text: str) -> None:
        log.info("%s", text)
        with open(self.log_path, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


_UNKNOWN = LeaseRecord()  # the lease could not be read: no verdict from it
