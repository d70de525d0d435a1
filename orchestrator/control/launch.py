"""`orch launch` as process control: the lock, the lease, preflight, Ctrl-C and its teardown, the hand-off to a
background controller, and that background controller itself (`orch _controller`).

The CLI parses, calls and prints; this module decides what the process does and tells the CLI through events
(dataclasses, handed to a callback): it prints nothing. Closing the terminal (SIGHUP) or a plain `kill` (SIGTERM)
is treated like Ctrl-C: the loop is handed to a background controller, so queued runs still start. `orch down`
(a stop mark beside the lock, then SIGTERM; or a stop request through the lease from another ORCH_HOME) wins over
a hand-off whichever process it reaches.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.base import Backend
from orchestrator.control import deadline, summary
from orchestrator.control.controller import Controller
from orchestrator.control.deadline import DEFAULT_SWITCH_S
from orchestrator.control.lease import Finished, Lease, LeaseLost
from orchestrator.control.notify import REMOTE_PATIENCE_S
from orchestrator.control.recorded import check_recorded, read_record
from orchestrator.control.state import State, SweepLock
from orchestrator.control.views import Progress, RunView
from orchestrator.errors import OrchError
from orchestrator.store import open_store
from orchestrator.store.base import Store
from orchestrator.store.status import QUEUED
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.wait import Timeout, retry_until

STOPPED_CODE = 143  # a launch stopped by `orch down`: the exit code of a process ended by SIGTERM
HAND_OFF_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# --- what the CLI is told -----------------------------------------------------------------------


@dataclass
class TookOver:
    """The lease was taken from a controller that had gone silent."""

    where: str
    silent_s: float


@dataclass
class Started:
    """Preflight and the sweep's record are done: the sweep starts (new) or continues."""

    new: bool


@dataclass
class NameFreed:
    """The sweep's name was launched from here with a store that no longer holds it: it means this sweep now."""

    text: str


@dataclass
class Detached:
    """`--detach`: the loop runs in a background controller from the start."""

    pid: int


@dataclass
class HandedOff:
    """Ctrl-C, SIGTERM or SIGHUP: the loop continues in a background controller."""

    pid: int


@dataclass
class Stopped:
    """`orch down` stopped this launch (here, or through the lease from elsewhere), or a controller restarted by its
    supervisor found the sweep's lease released for good: no controller continues."""

    text: str


@dataclass
class NotifyWaiting:
    """The loop ended and a `notify:` receiver keeps the launch waiting (down or slow): at most `patience_s` more."""

    pending: int
    patience_s: float


@dataclass
class NotStarting:
    """The background controller found the sweep stopped by `orch down` while the loop was handed to it."""


@dataclass
class DeadlineNote:
    """`deadline:` — what the launch says of it (when it is, the work left, a move): control/deadline.py."""

    lines: list[str]


Event = DeadlineNote | TookOver | NameFreed | Started | Detached | HandedOff | Stopped | NotStarting | NotifyWaiting
OnEvent = Callable[[Event], None]
RunFn = Callable[[Callable[[Progress], None]], Progress]
Watch = Callable[[RunFn], Progress]  # drives the loop's run function with a table (the CLI's)


# --- the launch in the foreground ---------------------------------------------------------------


class Launch:
    """One `orch launch` of a sweep on this machine."""

    def __init__(self, sweep: Sweep, backend: Backend, store: Store, state: State, on_event: OnEvent):
        self.sweep, self.backend, self.store, self.state = sweep, backend, store, state
        self.on_event = on_event
        self.lock = SweepLock(state.home, sweep.spec.name)
        self.lease: Lease | None = None

    def run(self, detach: bool, watch: Watch) -> Progress | None:
        """Launch: the sweep's progress when the loop ran here to its end; None when it went to the background.
        A stop by `orch down` ends the process (exit 143) once its event is out."""
        check_recorded(self.sweep, self.store, self.state)  # a relaunch refused by the record touches nothing: no
        # stop mark cleared, no lease taken (and no "took the sweep over"); prepare() checks again under the lease
        timely = check_deadline(self.sweep, self.backend, self.store)  # a past or impossible one: refused here
        self.lock.acquire()
        self.lock.clear_stop()  # a launch after `orch down` runs the sweep again
        self.lease = take_lease(self.sweep, self.store, self.state, self.on_event)  # before preflight: a sweep
        # run elsewhere buys nothing here
        spec = self.sweep.spec
        freed = self.state.check_same_store(spec.name, str(self.sweep.path), self.sweep.store_url)
        if freed:
            self.on_event(NameFreed(freed))
        if timely:
            self.on_event(DeadlineNote(timely))
        self.state.remember(spec.name, str(self.sweep.path), self.sweep.store_url, spec.backend)  # `orch down NAME`
        # finds the sweep while preflight runs (seconds on AWS), before the store has its record
        # SIGTERM or a closed terminal in the first seconds (preflight makes the security group, template and
        # profile on AWS) is treated like Ctrl-C there: whatever preflight made is removed before orch exits.
        for sig in HAND_OFF_SIGNALS:
            signal.signal(sig, _hand_off)
        controller = Controller(self.sweep, self.backend, self.store, self.state)
        controller.lease = self.lease
        controller.on_notify_wait = lambda n: self.on_event(NotifyWaiting(n, controller.notify_patience_s))
        new = self._prepare(controller)
        try:
            self.on_event(Started(new))
            progress = None if detach else self._loop(controller, watch)
        except KeyboardInterrupt:  # Ctrl-C (or SIGTERM, SIGHUP) whenever it came after preflight
            self._hand_over()
            return None
        finally:
            self.lock.release()
        if detach:
            self.lease.release("handed to a background controller")
            self.on_event(Detached(spawn_controller(self.sweep)))
        return progress

    def _prepare(self, controller: Controller) -> bool:
        """Preflight and the sweep's record; Ctrl-C here removes what this launch made (a new sweep's)."""
        assert self.lease is not None
        fresh = False  # a sweep seen before keeps what it has (its runs use it); an unreadable record is refused
        try:
            fresh = read_record(self.store, self.sweep.spec.name, str(self.sweep.path)) is None
            self.backend.preflight()
            return controller.prepare()
        except KeyboardInterrupt:
            removed = self.backend.teardown() if fresh else []
            self.lease.release("interrupted before the sweep started")
            self.lock.release()
            raise OrchError(
                f"interrupted before the sweep started; removed what this launch had made ({len(removed)} "
                f"resource(s)). Nothing new runs.",
                exit_code=130,
            ) from None
        except BaseException:
            self.lease.release("the launch failed before the sweep started")
            raise

    def _loop(self, controller: Controller, watch: Watch) -> Progress:
        try:
            return watch(controller.run)
        except LeaseLost as exc:
            if not exc.stopped:
                raise
            self._stopped(str(exc))
            raise  # (not reached: _stopped ends the process)

    def _hand_over(self) -> None:
        """The loop goes to a background controller, unless `orch down` asked for a stop."""
        for sig in (signal.SIGINT, *HAND_OFF_SIGNALS):  # the hand-off itself is not interrupted
            signal.signal(sig, signal.SIG_IGN)
        if self.lock.stop_asked():
            self._stopped(f"stopped by `orch down {self.sweep.spec.name}`: no controller continues this sweep.")
        assert self.lease is not None  # the loop released it on its way out; a signal before the loop began did not
        self.lease.release("handed to a background controller")
        self.lock.release()
        self.on_event(HandedOff(spawn_controller(self.sweep)))

    def _stopped(self, text: str) -> None:
        """A stop, not a hand-off. The process ends at once, lock held to the end, so `orch down` (waiting for
        the lock) stops the runs only once nothing of this launch can start more: provisioning threads still in
        flight would otherwise start an agent, or buy an instance, after it."""
        self.on_event(Stopped(text))
        _end_now(STOPPED_CODE)


def _end_now(code: int) -> None:
    """End the process at once, what it printed flushed: a stopped controller's provisioning threads must not buy an
    instance or start an agent after `orch down` went on (at exit the interpreter would join them)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _hand_off(signum, _frame):
    raise KeyboardInterrupt  # the same path as Ctrl-C


def take_lease(sweep: Sweep, store: Store, state: State, on_event: OnEvent) -> Lease:
    """The sweep's lease in the store: one controller per sweep, whatever machine or ORCH_HOME runs it."""
    lease = Lease(store, sweep.spec.name, state.home, str(sweep.path)).acquire()
    if lease.took_over is not None:
        on_event(TookOver(lease.took_over.holder.where(), lease.took_over.age()))
    return lease


def spawn_controller(sweep: Sweep) -> int:
    """Start the background controller (`orch _controller`) and return its pid once it holds the sweep's lock."""
    log_dir = orch_home() / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{sweep.spec.name}-controller.log", "ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "_controller", str(sweep.path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lock = SweepLock(orch_home(), sweep.spec.name)
    with contextlib.suppress(Timeout):
        retry_until(lambda: lock.holder() == proc.pid or proc.poll() is not None, 15, 0.05, "the background controller")
    if proc.poll() is not None:
        if lock.stop_asked():
            raise OrchError(
                f"stopped by `orch down {sweep.spec.name}`: no controller continues this sweep.", STOPPED_CODE
            )
        raise OrchError(f"the background controller exited at once (code {proc.returncode}); see {log_file.name}")
    return proc.pid


# --- the background controller ------------------------------------------------------------------


def serve(
    sweep: Sweep, backend: Backend, store: Store, state: State, on_event: OnEvent, remote: bool = False
) -> Progress | None:
    """`orch _controller`: the loop without a terminal (after --detach or a hand-off, and on a remote controller's
    instance), to its end; None when `orch down` stopped it (an event says so). SIGTERM ends it: exit 0 with the lease
    released, or on a remote controller's instance exit 143 with the lease kept for its supervisor's next controller."""
    lock = SweepLock(state.home, sweep.spec.name)
    lock.acquire()
    try:
        lease = take_lease(sweep, store, state, on_event)
    except Finished as exc:  # restarted by its supervisor after the sweep ended or was stopped: nothing to do
        on_event(Stopped(str(exc)))
        return None

    def leave(*_) -> None:
        # a remote controller's SIGTERM is systemd stopping its unit (its supervisor died, a reboot), not the
        # sweep's end: the lease stays held for the supervisor's next controller, and the supervisor (if alive)
        # sees a failure and restarts it
        lease.abandon()
        sys.exit(STOPPED_CODE)

    signal.signal(signal.SIGTERM, leave if remote else lambda *_: sys.exit(0))
    if lock.stop_asked():  # `orch down` came while a launch handed the loop over: the stop wins
        lease.release("stopped by `orch down` before it started", final=True)
        on_event(NotStarting())
        return None
    controller = Controller(sweep, backend, store, state)
    controller.lease = lease
    if remote:  # nobody waits on this instance: it keeps trying to deliver before it ends
        controller.notify_patience_s, controller.notify_hand_off = REMOTE_PATIENCE_S, False
    controller.prepare()
    try:
        progress = controller.run()
    except LeaseLost as exc:
        if not exc.stopped:
            raise
        on_event(Stopped(str(exc)))  # `orch down` goes on as soon as it reads the lease ended
        _end_now(0)  # (0: the sweep's end for a remote controller's supervisor, as before)
    return progress


def code_note(sweep: Sweep) -> str | None:
    """A line when this folder is not the code the sweep runs (control/code.py), without creating a store."""
    from orchestrator.control.code import note

    if sweep.snapshot is None or not (sweep.store_url.startswith("s3://") or Path(sweep.store_url).is_dir()):
        return None
    return note(sweep, open_store(sweep.store_url))


def check_deadline(sweep: Sweep, backend: Backend, store: Store | None) -> list[str]:
    """`deadline:` as the launch sees it (control/deadline.py: at_launch): its lines, or OrchError (exit 2) for a
    deadline in the past or one that even all on-demand cannot meet. `store` None: a new sweep's store not made yet."""
    if not sweep.spec.deadline:
        return []
    record = read_record(store, sweep.spec.name, str(sweep.path)) if store is not None else None
    order = [run.run_id for run in sweep.runs]
    rows = summary.read(store, sweep.spec.name, order) if store is not None and record is not None else None
    views = list(rows.values()) if rows else [RunView(rid, QUEUED, 0, 0, 0, None, {}) for rid in order]
    lines, problem = deadline.at_launch(sweep, record, views, backend.switch_s() or DEFAULT_SWITCH_S, time.time())
    if problem:
        raise OrchError(problem, exit_code=2)
    return lines


def existing_store(sweep: Sweep) -> Store | None:
    """The sweep's store when it exists (an S3 URL always does here), without creating a folder; None otherwise."""
    return (
        open_store(sweep.store_url) if sweep.store_url.startswith("s3://") or Path(sweep.store_url).is_dir() else None
    )


def check_like_launch(sweep: Sweep) -> str | None:
    """A dry run refuses what the launch would refuse, without creating anything. Returns the line the launch would
    say when it takes the sweep's name over from a store that no longer holds it."""
    freed = State().check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)
    store = existing_store(sweep)
    if store is not None:
        check_recorded(sweep, store, State())
    return freed
