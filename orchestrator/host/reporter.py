"""The agent's reporter: the one writer of the running attempt's record, and its heartbeat thread.

Every write is conditional (status.update_status) and only while the record is still this
attempt's: once the controller has moved on (a newer attempt, or this one called lost) the
reporter writes nothing more and says so (`superseded`), and the agent stops its command.
The heartbeat runs on its own thread, so neither a large restore nor a large checkpoint upload
can make a live host look lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from orchestrator.host.attempt import RungWatch
from orchestrator.store.base import Store
from orchestrator.store.status import (
    CORRUPT,
    RUNNING,
    STARTING,
    RunStatus,
    read_versioned,
    write_if,
)

log = logging.getLogger("orch.agent")


class Reporter:
    def __init__(
        self,
        store: Store,
        sweep: str,
        run_id: str,
        attempt: int,
        metrics_file: Path,
        watch: RungWatch | None = None,
        reported: Path | None = None,
        record_s: float | None = None,
        rungs_recorded: Callable[[dict[str, float]], None] | None = None,
    ):
        self.store, self.sweep, self.run_id, self.attempt = store, sweep, run_id, attempt
        self.metrics_file = metrics_file
        self.watch = watch or RungWatch(metrics_file)  # reads only what the file gained since the last beat
        self.lock = threading.RLock()  # the record is shared by the attempt and the heartbeat thread
        self.superseded = False
        self.version: str | None = None  # of this reporter's last write: while nobody else wrote, no read is needed
        self.reported = reported  # ctl/reported: the sign of life a local backend reads (contract.REPORTED_FILE)
        self.record_s = record_s  # set: a beat writes the record only this often, unless something in it moved on
        self._sent: tuple = ()  # (state, rungs reported) of the last record written
        self._sent_at = float("-inf")
        self.rungs_recorded = rungs_recorded  # told the values at rungs each record written has (aws: RungTags)
        self.moved = [0, 0]  # bytes this attempt moved up to and down from the store: stamped on every record

    def count(self, up: int = 0, down: int = 0) -> None:
        """Bytes moved to (up) and from (down) the store; the next record carries them (inter-region transfer)."""
        with self.lock:
            self.moved[0] += up
            self.moved[1] += down

    def record(self, status: RunStatus, tries: int = 20) -> bool:
        """Write the record; False (and nothing written, ever again) once it is no longer this attempt's.

        A write goes over the version this reporter itself wrote last (one request); only when
        someone else wrote since (the controller's claim at the start, or a verdict) is the record
        read again, and then written only if it is still this attempt's.
        """
        with self.lock:
            for _ in range(tries):
                if self.superseded:
                    return False
                if self.version is None:
                    current, version = read_versioned(self.store, self.sweep, self.run_id)
                    if current.state == CORRUPT:  # no verdict can be read in it: the running attempt's record is ours
                        log.warning("%s; writing attempt %s's record over it", current.reason, self.attempt)
                    elif current.attempt != self.attempt or current.state not in (STARTING, RUNNING):
                        # someone else's write since this reporter's: a newer attempt, or a verdict on this one (lost,
                        # pruned, cancelled or stopped while its host booted, failed): it stands
                        self.superseded = True
                        log.warning(
                            "the record of %s is no longer attempt %s's (the controller moved on): writing nothing "
                            "more",
                            self.run_id,
                            self.attempt,
                        )
                        return False
                else:
                    version = self.version
                moved = {**status.moved, str(self.attempt): list(self.moved)} if any(self.moved) else status.moved
                self.version = write_if(self.store, self.sweep, replace(status, moved=moved), version)
                if self.version is not None:
                    self._sent, self._sent_at = _what_moves(status), status.heartbeat or time.time()
                    self._sign(self._sent_at, self.version)
                    if self.rungs_recorded is not None and status.at_rungs:
                        self.rungs_recorded(status.at_rungs)
                    return True
            raise OSError(f"status record of {self.sweep}/{self.run_id} kept changing under {tries} writes in a row")

    def beat(self, status: RunStatus, now: float | None = None) -> None:
        """Alive, and the newest metrics line. With `record_s`, the record is rewritten only when it is due or
        what the controller acts on changed (a rung reported); else only ctl/reported is touched."""
        now = time.time() if now is None else now
        with self.lock:
            if status.state not in (STARTING, RUNNING):
                return  # interrupted or ended: that record stands
            if status.state == RUNNING:
                self.watch.report(status)
            if self.record_s is not None and now - self._sent_at < self.record_s and _what_moves(status) == self._sent:
                self._sign(now)
                return
            status.heartbeat = now
            self.record(status)

    def _sign(self, now: float, version: str | None = None) -> None:
        """ctl/reported: touched at `now` (alive), and given the record's new version when there is one."""
        if self.reported is None:
            return
        try:
            if version is not None:
                self.reported.write_text(version)
            os.utime(self.reported, (now, now))
        except OSError as exc:  # nobody can see this sign: every beat is a record again, as without record_s
            if self.record_s is not None:
                log.warning(
                    "could not touch %s (%s): every heartbeat writes the record from now on", self.reported, exc
                )
            self.record_s = None

    def heartbeats(self, current: Callable[[], RunStatus], period: float) -> Heartbeats:
        """Beat every `period` on a thread, with the record `current()` gives (the agent's, whichever it holds now)."""
        return Heartbeats(lambda: self.beat(current()), period)


class Heartbeats:
    """Call beat() every period seconds on a thread while the block runs."""

    def __init__(self, beat, period: float):
        self.beat, self.period, self.done = beat, period, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="orch-heartbeat")

    def _loop(self) -> None:
        while not self.done.wait(self.period):
            try:
                self.beat()
            except Exception as exc:  # a failed beat is retried next period; the main work goes on
                log.warning("heartbeat failed: %s", exc)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


def _what_moves(status: RunStatus) -> tuple:
    """What in a record makes the controller act: its state, attempt and the rungs reported."""
    return (status.state, status.attempt, tuple(sorted(status.at_rungs.items())))
