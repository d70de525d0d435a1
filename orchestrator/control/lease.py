"""One controller per sweep per store, whatever machine runs it: a lease record, `<sweep>/controller.json`.

The flock of control/state.py keeps two controllers of one ORCH_HOME apart; two ORCH_HOMEs (two users, a
laptop and a remote controller, a container beside the host) share nothing but the store, so the lease lives
there. Every write is conditional (put_if on the version read), so of two controllers racing for a sweep
exactly one holds it. The holder renews its heartbeat from its pass loop; a lease whose heartbeat is older
than `stale_after_s` (or whose holder's process is gone, when it ran on this very machine) is taken over, again
conditionally. A remote controller restarted by its own supervisor takes its dead predecessor's lease at once: the
supervisor starts one controller at a time, so a lease held under its id is held by a controller that has exited.
A release says whether it is `final` (every run final, or stopped by `orch down`): such a lease is free to a new
launch, but a controller restarted by the same supervisor does not take it (`Finished`: nothing is left for it).
A remote controller stopped by a signal (systemd stopping its unit, a reboot) does not release at all (`abandon`):
its supervisor's next controller takes the lease at once, or it lapses and the instance's watchdog ends it.
`orch down` from anywhere asks the holder to stop by writing `stop_requested` into the record: the holder reads
its record every READ_S between its writes (a GET; it writes only every RENEW_S), sees the record moved, reads why,
and ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store, json_bytes

RENEW_S = 15.0  # a heartbeat write at most this often: one PUT per 15 s is 5,760 a day (under $0.03 on S3); between
# writes a GET at most every READ_S sees a stop request within seconds
READ_S = 3.0  # 23,040 GETs a day (4 per renewal), under $0.01; a GET each 1 s pass was 80,640 ($0.03: 20 runs' bill
# was $0.51 a day, over the $0.50 goal of tests/bench/test_bench_s3_requests.py); a stop waits at most 3 s longer
STALE_S = 120.0  # eight renewals missed: the holder is gone (generous, for clock skew and a slow pass)

# Where the controller runs, when it runs on an instance orch started for it (the remote controller's unit
# file sets them): the lease then names the instance, and `orch status` says where to look.
INSTANCE_ENV = ("ORCH_CONTROLLER_INSTANCE_ID", "ORCH_CONTROLLER_INSTANCE_TYPE", "ORCH_CONTROLLER_REGION")
SUPERVISOR_ENV = "ORCH_SUPERVISOR"  # the id of the supervisor (control/supervisor.py) that started this controller


def lease_key(sweep: str) -> str:
    return layout.controller_key(sweep)


@dataclass
class Holder:
    """Who holds the lease, and where: enough for another machine to say where the controller runs."""

    host: str = ""  # hostname of the machine it runs on
    pid: int = 0
    token: str = ""  # this controller's own id (a pid may repeat across machines)
    boot_id: str = ""  # Linux boot id: a pid is only comparable on the same boot of the same host
    home: str = ""  # its ORCH_HOME
    instance_id: str = ""  # the EC2 instance, for a remote controller
    instance_type: str = ""
    region: str = ""
    supervisor: str = ""  # the supervisor that started it, on a remote controller's instance

    @classmethod
    def here(cls, home: Path) -> Holder:
        iid, itype, region = (os.environ.get(k, "") for k in INSTANCE_ENV)
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            token=uuid.uuid4().hex,
            boot_id=_boot_id(),
            home=str(home),
            instance_id=iid,
            instance_type=itype,
            region=region,
            supervisor=os.environ.get(SUPERVISOR_ENV, ""),
        )

    def where(self) -> str:
        if self.instance_id:
            return f"instance {self.instance_id} ({self.instance_type or '?'}, {self.region or '?'}) pid {self.pid}"
        return f"{self.host} pid {self.pid} (ORCH_HOME {self.home})"


@dataclass
class LeaseRecord:
    """Contents of controller.json."""

    holder: Holder = field(default_factory=Holder)
    started: float = 0.0  # when this holder took the lease
    heartbeat: float = 0.0  # its last renewal
    stale_after_s: float = STALE_S  # the holder's own promise: it renews well within this
    ended: float | None = None  # released: the sweep finished, the loop was handed on, or it was stopped
    end_reason: str = ""
    final: bool = False  # released because no controller is needed: every run final, or stopped by `orch down`
    stop_requested: float | None = None  # `orch down` asks the holder to stop
    stop_by: str = ""  # who asked

    def age(self, now: float | None = None) -> float:
        return max(0.0, (now or time.time()) - self.heartbeat)

    def alive(self, now: float | None = None) -> bool:
        """Held by a controller that still renews it."""
        if self.ended is not None or self.age(now) > self.stale_after_s:
            return False
        return not _gone_here(self.holder)

    def to_json(self) -> dict:
        return asdict(self)


def read_lease(store: Store, sweep: str) -> tuple[LeaseRecord | None, str | None]:
    """The lease and its version; (None, version) for no record or one that cannot be read (taken over)."""
    data, version = store.get_versioned(lease_key(sweep))
    if data is None:
        return None, None
    try:
        raw = json.loads(data)
        holder = Holder(**{k: v for k, v in raw.get("holder", {}).items() if k in _names(Holder)})
        rec = LeaseRecord(**{k: v for k, v in raw.items() if k in _names(LeaseRecord) and k != "holder"})
        rec.holder = holder
        _numbers = float(rec.heartbeat), float(rec.stale_after_s)  # a record whose times are no numbers is corrupt
    except (ValueError, TypeError, AttributeError):
        return None, version
    return rec, version


class Lease:
    """This controller's hold on a sweep."""

    def __init__(self, store: Store, sweep: str, home: Path, spec_path: str = ""):
        self.store, self.sweep, self.spec_path = store, sweep, spec_path
        self.holder = Holder.here(home)
        self.version: str | None = None
        self.record: LeaseRecord | None = None
        self.took_over: LeaseRecord | None = None  # the stale lease this one replaced, for the log
        self._renewed = 0.0
        self._read = 0.0  # when the record was last read or written by this holder

    def acquire(self, tries: int = 5, now: float | None = None) -> Lease:
        """Take the sweep, or refuse (OrchError, exit 2) when a live controller holds it. `now`: the clock (a test's
        simulated one; the wall clock by default)."""
        for _ in range(tries):
            current, version = read_lease(self.store, self.sweep)
            if current is not None and current.alive(now) and not self._restart_of(current.holder):
                raise OrchError(refusal(self.sweep, current, self.spec_path, now), exit_code=2)
            if current is not None and current.ended is not None and current.final and self._restart_of(current.holder):
                raise Finished(self.sweep, current)
            now = time.time() if now is None else now
            record = LeaseRecord(holder=self.holder, started=now, heartbeat=now)
            new = self.store.put_if(lease_key(self.sweep), json_bytes(record.to_json()), version)
            if new:
                self.version, self.record, self._renewed = new, record, now
                self._read = now
                self.took_over = current if current is not None and current.ended is None else None
                return self
        raise OrchError(
            f"the lease of sweep {self.sweep!r} ({lease_key(self.sweep)}) kept changing under {tries} tries; "
            f"another controller is starting. Watch it with `orch status {self.sweep}`.",
            exit_code=2,
        )

    def _restart_of(self, holder: Holder) -> bool:
        """The holder was started by this controller's own supervisor, which starts the next only once it exited."""
        return bool(self.holder.supervisor) and holder.supervisor == self.holder.supervisor

    def renew(self, force: bool = False, now: float | None = None) -> None:
        """The heartbeat, from the pass loop: written when due, the record read otherwise (at most every READ_S).
        Raises LeaseLost when the record moved on (another controller took it over, or `orch down` asked this one to
        stop)."""
        now = time.time() if now is None else now
        if self.record is None:
            return
        if not force and now - self._renewed < RENEW_S:
            if now - self._read < READ_S:
                return
            self._read = now
            if self.store.get_versioned(lease_key(self.sweep))[1] == self.version:
                return  # (a stop request changes the record: the write below then fails and says why)
        self.record.heartbeat = now
        new = self.store.put_if(lease_key(self.sweep), json_bytes(self.record.to_json()), self.version)
        if new:
            self.version, self._renewed, self._read = new, now, now
            return
        current, version = read_lease(self.store, self.sweep)
        self.record = None
        lost = LeaseLost(self.sweep, current, self.holder)
        # say so at once: `orch down` on another machine waits for it (a pid there tells nothing)
        if lost.stopped and current is not None:
            current.ended, current.end_reason = now, f"stopped by `orch down` ({current.stop_by or 'another machine'})"
            current.final = True
            with contextlib.suppress(OSError):
                self.store.put_if(lease_key(self.sweep), json_bytes(current.to_json()), version)
        raise lost

    def release(self, reason: str, final: bool = False, now: float | None = None) -> None:
        """Give the sweep up (the end, a hand-off, a stop): another controller may take it at once. `final`: no
        controller is needed any more (every run final, or stopped): its own supervisor's restart does not take it."""
        if self.record is None:
            return
        ended = time.time() if now is None else now
        record, version = self.record, self.version
        self.record = None
        with contextlib.suppress(OSError):  # the store went away (the error that ended the loop says so): it lapses
            for _ in range(5):
                record.ended, record.end_reason, record.final = ended, reason, final
                if self.store.put_if(lease_key(self.sweep), json_bytes(record.to_json()), version):
                    return
                # the record moved: `orch down` wrote a stop request into it (then it is still this holder's, and the
                # release must land, or the stop would wait the whole 120 s), or another controller took it over
                current, version = read_lease(self.store, self.sweep)
                if current is None or current.holder.token != self.holder.token or current.ended is not None:
                    return
                record = current

    def abandon(self) -> None:
        """Stop holding the sweep without a word (a remote controller stopped by a signal, whose supervisor or
        systemd starts the next): the record stays as last renewed, so the next controller of the same supervisor
        takes it at once, and if none comes it lapses after `stale_after_s`. A release here would read as the
        sweep's end to its watchdog, to `orch status` and to a launch from the laptop until that controller came."""
        self.record = None


class Finished(OrchError):
    """A controller restarted by its own supervisor finds the sweep's lease released for good (every run final, or
    stopped by `orch down`): it does not start again, and its supervisor ends."""

    exit_code = 0  # (serve() catches it: the supervisor sees a controller that ended)

    def __init__(self, sweep: str, current: LeaseRecord):
        super().__init__(
            f"sweep {sweep}: its lease was released for good ({current.end_reason or 'no reason given'}); this "
            "restarted controller does not start it again"
        )


class LeaseLost(OrchError):
    """The lease moved on under a running controller: it must stop acting on the sweep."""

    def __init__(self, sweep: str, current: LeaseRecord | None, me: Holder):
        if current is not None and current.stop_requested is not None and current.holder.token == me.token:
            self.stopped = True
            text = (
                f"sweep {sweep}: stopped by `orch down` ({current.stop_by or 'another machine'}); this controller ends"
            )
        else:
            self.stopped = False
            who = current.holder.where() if current is not None else "nobody (the record is gone)"
            text = (
                f"sweep {sweep}: another controller took the sweep over ({who}) while this one was silent for more "
                f"than {STALE_S:.0f} s; this one stops so that only one acts on it"
            )
        super().__init__(text, exit_code=1)


def request_stop(store: Store, sweep: str, by: str, tries: int = 10, now: float | None = None) -> LeaseRecord | None:
    """`orch down`: ask the live holder to stop (it ends at its next renewal). Returns the live lease, or None."""
    for _ in range(tries):
        current, version = read_lease(store, sweep)
        if current is None or not current.alive(now):
            return None
        if current.stop_requested is None:
            current.stop_requested, current.stop_by = time.time() if now is None else now, by
            if not store.put_if(lease_key(sweep), json_bytes(current.to_json()), version):
                continue
        return current
    return None


def wait_released(store: Store, sweep: str, timeout: float) -> bool:
    """After request_stop: whether the holder ended (or its lease lapsed) within `timeout` seconds."""
    from orchestrator.wait import Timeout, retry_until

    def released() -> bool:
        current, _ = read_lease(store, sweep)
        return current is None or not current.alive()

    try:
        return retry_until(released, timeout, 0.5, f"the controller of {sweep} to stop")
    except Timeout:
        return False


def refusal(sweep: str, lease: LeaseRecord, spec_path: str = "", now: float | None = None) -> str:
    again = f"`orch launch {spec_path}`" if spec_path else "`orch launch` of its file"
    down = f"`orch down {spec_path}`" if spec_path else "`orch down` of its file"
    return (
        f"sweep {sweep!r} is already run by a controller on {lease.holder.where()}, last heartbeat "
        f"{lease.age(now):.0f} s ago (store record {lease_key(sweep)}). One controller per sweep: watch it with "
        f"`orch status {sweep} --watch`, or stop it with {down} (from any machine with the store; `orch down "
        f"{sweep}` from the ORCH_HOME that launched it). "
        f"If that controller is gone, its lease lapses {lease.stale_after_s:.0f} s after its last heartbeat; "
        f"then {again} takes the sweep over."
    )


def _names(cls) -> set:
    return {f.name for f in fields(cls)}


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _gone_here(holder: Holder) -> bool:
    """The holder ran on this machine, in this boot, and its process is gone: no need to wait for staleness.
    A controller on an instance is judged by its heartbeat only (a fake cloud's instance shares this host)."""
    if holder.instance_id or os.environ.get(INSTANCE_ENV[0]) or holder.host != socket.gethostname():
        return False
    if not holder.boot_id or holder.boot_id != _boot_id() or holder.pid <= 0:
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (exited, not yet reaped by whoever adopted it) is gone too
        return Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False
