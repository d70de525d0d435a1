"""The lease's harness: Hypothesis's stateful testing over orch's real `Lease` (control/lease.py) on a real folder
store, with a simulated clock, and the promises the lease makes checked after every step.

Why a machine of its own beside machine.py's: the defects of the lease were all interleavings of controllers
(issue 44: a supervisor's restart refused by its dead predecessor's lease — item 14; a launch's background
controller refused by the launch's own lease — item 15; `orch down` through the lease taking ~50 s — item 21; a
lease judged stale after 15 s instead of 120 s — item 24). Those are steps of several controllers on several machines
sharing one record, which the sweep's machine (one controller at a time) cannot express.

The actors: controllers launched on three machines (a laptop, a desk, a controller's instance), each with or without a
supervisor; a supervisor restarting its controller once it exited; `orch down` from anywhere; a corrupted record;
time passing. Each controller's process may be killed, may abandon the lease (a signal on an instance), release it
(a hand-off, or final), or renew it after any pause, short or long. The promises, as the lease's docstring and the
docs state them (docs/guides/unattended.md), with the documented figures written here and not read from the code (a
changed constant must fail here):
- a launch takes the sweep if and only if nobody holds it: no record, an unreadable one, a released one, or one whose
  heartbeat is older than 120 s; otherwise it is refused (exit 2) with the holder named;
- a controller restarted by its own supervisor takes its predecessor's lease at once, unless that lease was released
  for good (then it does not start: Finished);
- one acts at a time: two controllers never both hold the sweep having read it within the last 3 s (the read
  interval) — except in the 3 s after a record became unreadable (taken over at once), which the holder's next read
  notices;
- a renew that looked at the record (it does at least every 3 s) returns only while the record is its own and no stop
  was asked; a stop asked by `orch down` ends the holder at its first renewal 3 s or more later, and the record then
  says it ended for good.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from orchestrator.control.lease import Finished, Lease, LeaseLost, LeaseRecord, lease_key, read_lease, request_stop
from orchestrator.errors import OrchError
from orchestrator.store.folder import LocalStore

SWEEP = "s"
MACHINES = ("laptop", "desk", "i-0123456789abcdef0")  # none is this host: each holder is judged by its heartbeat only
STALE = 120.0  # documented: a lease whose heartbeat is older is taken over
READ = 3.0  # documented: a holder reads its record at least this often between its writes
RENEW = 15.0  # documented: a holder writes its heartbeat at most this often
PAUSES = (0.5, 1.0, 2.9, 3.0, 3.5, 14.0, 15.0, 16.0, 60.0, 119.0, 121.0, 125.0, 150.0, 200.0, 300.0)


@dataclasses.dataclass
class Ctl:
    """A controller's process and what the harness saw of it."""

    name: str
    lease: Lease
    supervisor: str
    running: bool = True
    last_ok: float = -1e9  # when its acquire or renew last returned normally
    last_write: float = -1e9  # when it last wrote its heartbeat (as the documented RENEW_S has it)
    last_look: float = -1e9  # when it last read its record (as the documented READ_S has it)

    @property
    def token(self) -> str:
        return self.lease.holder.token

    @property
    def holds(self) -> bool:
        return self.running and self.lease.record is not None


class LeaseHarness(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="orch-lease-harness-"))
        self.store = LocalStore(str(self.tmp / "store"))
        self.now = 1_000_000.0
        self.ctls: list[Ctl] = []
        self.latest: dict[str, Ctl] = {}  # supervisor -> the controller it started last
        self.corrupted_at = -1e9
        # the harness's own account of who holds the sweep, from what it did (never read from the record)
        self.holder: Ctl | None = None
        self.ended = False  # the holder released it (a hand-off, the end, a stop)
        self.final = False  # ... for good
        self.stops: dict[str, float] = {}  # holder token -> when `orch down` asked it to stop
        self.log: list[str] = []

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- helpers ---------------------------------------------------------------------------------------------
    def stored(self) -> LeaseRecord | None:
        return read_lease(self.store, SWEEP)[0]

    def say(self, text: str) -> None:
        self.log.append(f"t+{self.now - 1_000_000.0:.1f} {text}")

    def why(self) -> str:
        return "\n".join(self.log[-12:])

    def free(self) -> bool:
        """The documented rule for a launch from elsewhere: nobody holds the sweep (none took it, or the record became
        unreadable, or its holder released it, or its last heartbeat is over 120 s old)."""
        return self.holder is None or self.ended or self.now - self.holder.last_write > STALE

    def start(self, machine: str, supervisor: str) -> Ctl:
        lease = Lease(self.store, SWEEP, self.tmp / machine)
        lease.holder.host, lease.holder.supervisor = machine, supervisor
        ctl = Ctl(f"c{len(self.ctls)}@{machine}", lease, supervisor)
        self.ctls.append(ctl)
        return ctl

    def acquired(self, ctl: Ctl) -> None:
        ctl.last_ok = ctl.last_write = ctl.last_look = self.now
        self.holder, self.ended, self.final = ctl, False, False
        if ctl.supervisor:  # a supervisor whose controller is refused or finished ends (with its instance)
            self.latest[ctl.supervisor] = ctl
        self.say(f"{ctl.name} took the lease")

    # --- rules -----------------------------------------------------------------------------------------------
    @initialize(machine=st.sampled_from(MACHINES), supervised=st.booleans())
    def first_launch(self, machine: str, supervised: bool) -> None:
        self.launch(machine, supervised)

    @rule(machine=st.sampled_from(MACHINES), supervised=st.booleans())
    def launch(self, machine: str, supervised: bool) -> None:
        """`orch launch` (or `--remote`: a new supervisor of its own) from a machine."""
        free = self.free()
        ctl = self.start(machine, f"sup{len(self.ctls)}" if supervised else "")
        try:
            ctl.lease.acquire(now=self.now)
        except Finished:
            raise AssertionError(f"a fresh launch was told the sweep is finished\n{self.why()}") from None
        except OrchError as exc:
            ctl.running = False
            self.say(f"{ctl.name} refused")
            assert exc.exit_code == 2 and "already run by a controller" in str(exc), str(exc)
            assert not free, f"a launch was refused though nobody held the sweep (items 15, 22)\n{self.why()}"
            return
        assert free, f"{ctl.name} took the sweep from a live holder (item 24)\n{self.why()}"
        self.acquired(ctl)

    @precondition(lambda self: any(not c.running and c is self.latest.get(c.supervisor) for c in self.ctls))
    @rule(data=st.data())
    def supervisor_restart(self, data) -> None:
        """A supervisor starts its controller again once the last one it started has exited."""
        gone = [c for c in self.ctls if not c.running and c is self.latest.get(c.supervisor)]
        old = data.draw(st.sampled_from(gone))
        free, held = self.free(), self.holder
        ctl = self.start(old.lease.holder.host, old.supervisor)
        own = held is not None and held.supervisor == old.supervisor
        try:
            ctl.lease.acquire(now=self.now)
        except Finished:
            ctl.running = False
            self.say(f"{ctl.name} (restart) finished")
            del self.latest[old.supervisor]
            assert own and self.ended and self.final, f"a restart was told finished\n{self.why()}"
            return
        except OrchError:
            ctl.running = False
            self.say(f"{ctl.name} (restart) refused")
            del self.latest[old.supervisor]
            assert not own and not free, (
                f"a supervisor's restart was refused by its own predecessor's lease (item 14)\n{self.why()}"
            )
            return
        assert own or free, f"a restart took the sweep from another live holder\n{self.why()}"
        assert not (own and self.ended and self.final), f"a restart ignored a release for good\n{self.why()}"
        self.acquired(ctl)

    @precondition(lambda self: any(c.holds for c in self.ctls))
    @rule(data=st.data(), pause=st.sampled_from(PAUSES))
    def renew(self, data, pause: float) -> None:
        """A pass of a controller after `pause` seconds (a long pause: a laptop asleep, a stalled process)."""
        ctl = data.draw(st.sampled_from([c for c in self.ctls if c.holds]))
        self.now += pause
        looks = self.now - ctl.last_look >= READ or self.now - ctl.last_write >= RENEW
        stop = self.stops.get(ctl.token)
        try:
            ctl.lease.renew(now=self.now)
        except LeaseLost as lost:
            ctl.running = False
            after = self.stored()
            self.say(f"{ctl.name} lost the lease (stopped={lost.stopped})")
            assert after is None or after.holder.token != ctl.token or stop is not None, (
                f"{ctl.name} was told it lost a lease that is still its own\n{self.why()}"
            )
            if lost.stopped:
                self.ended = self.final = True
                assert after is not None and after.ended is not None and after.final, (
                    f"a controller stopped by `orch down` left its lease unreleased\n{self.why()}"
                )
            return
        self.say(f"{ctl.name} renewed after {pause} s (looked: {looks})")
        ctl.last_ok = self.now
        if self.now - ctl.last_write >= RENEW:
            ctl.last_write = self.now
        if looks:
            ctl.last_look = self.now
            rec = self.stored()
            assert rec is not None and rec.holder.token == ctl.token and rec.stop_requested is None, (
                f"{ctl.name}'s renew read its record and went on, but the record is not its own or a stop was asked\n"
                f"{self.why()}"
            )
        assert stop is None or self.now - stop < READ, (
            f"{ctl.name} went on {self.now - stop:.1f} s after `orch down` asked it to stop (item 21)\n{self.why()}"
        )

    @precondition(lambda self: any(c.running for c in self.ctls))
    @rule(data=st.data(), how=st.sampled_from(["kill", "abandon", "handoff", "final"]))
    def end(self, data, how: str) -> None:
        """A controller's process ends: SIGKILL, a signal on an instance (abandon), a hand-off, or the sweep's end."""
        ctl = data.draw(st.sampled_from([c for c in self.ctls if c.running]))
        if how == "abandon":
            ctl.lease.abandon()
        elif how in ("handoff", "final"):
            ctl.lease.release(
                "handed to a background controller" if how == "handoff" else "done", how == "final", now=self.now
            )
            if ctl is self.holder and not self.ended:
                self.ended, self.final = True, how == "final"
        ctl.running = False
        self.say(f"{ctl.name} ended ({how})")

    @rule()
    def down(self) -> None:
        """`orch down` through the lease, from any machine."""
        live = self.holder is not None and not self.ended and self.now - self.holder.last_write <= STALE
        asked = request_stop(self.store, SWEEP, "harness", now=self.now)
        self.say(f"orch down: {'asked ' + asked.holder.token[:6] if asked else 'no live holder'}")
        assert (asked is not None) == live, f"`orch down` misjudged whether a controller holds the sweep\n{self.why()}"
        if asked is not None:
            self.stops.setdefault(asked.holder.token, self.now)

    @rule()
    def corrupt(self) -> None:
        """The record becomes unreadable (a partial write by another tool, a hand edit)."""
        self.store.put_bytes(lease_key(SWEEP), b"{not json")
        self.corrupted_at = self.now
        self.holder = None
        self.say("record corrupted")

    @rule(pause=st.sampled_from(PAUSES))
    def wait(self, pause: float) -> None:
        self.now += pause

    # --- invariants ------------------------------------------------------------------------------------------
    @invariant()
    def one_acts_at_a_time(self) -> None:
        # a controller acts on what it last read: within READ of its last look (an acquire, a write or a read)
        acting = [c.name for c in self.ctls if c.holds and self.now - c.last_look < READ]
        if self.now - self.corrupted_at >= READ:
            assert len(acting) <= 1, f"two controllers act on the sweep at once: {acting}\n{self.why()}"
