"""A run's life as types: its states, the reasons an attempt is stopped, and the named transitions.

A record's state changes only here, through a transition that sets the state, the reason and the
times together and refuses a move the life of a run does not have (an `Impossible` error: a bug, or
a record that moved on under its writer). A transition returns a new record and leaves the one it was
given as it was: a writer whose conditional write is refused (the controller, whose cache holds the
records it read) still holds what the store has. The stop file (contract.py) carries a `StopReason`'s
value; each reason knows the state an attempt it stops ends in (`StopReason.to_state()`).

    controller:  queued|failed|lost|... ─claim─► starting ─requeue─► queued (no host for it)
                 corrupt (no host) ─recover─► lost (then a claim)
    agent:       starting ─start─► starting ─run─► running ─interrupt─► interrupted
                 starting|running|interrupted ─finish─► succeeded|failed|cancelled|pruned|stopped|lost|interrupted
    verdicts:    a live attempt ─lose|stop|fail|prune|cancel─► lost|stopped|failed|pruned|cancelled

`RunStatus` is the record (status.json; store/status.py reads and writes it conditionally).
Values are the strings records have always held, so records written before these types still read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NamedTuple


class _Word(str, Enum):
    """A str-valued enum that prints and formats as its value (as in the records and the logs)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class RunState(_Word):
    QUEUED = "queued"  # no attempt yet, or the last one never got a host
    STARTING = "starting"  # claimed by the controller; its host boots or its agent restores
    RUNNING = "running"  # the command runs
    SUCCEEDED = "succeeded"  # final
    FAILED = "failed"  # final once its restarts are spent
    CANCELLED = "cancelled"  # final (`orch cancel`, or the budget reached before it started)
    INTERRUPTED = "interrupted"  # a spot notice: checkpointed, resumes on a new host (free)
    LOST = "lost"  # its host vanished or went silent: resumes on a new host (free)
    STOPPED = "stopped"  # `orch down`: resumes on the next launch
    PRUNED = "pruned"  # stopped by `prune:` (successive halving): final, not a failure, never retried
    CORRUPT = "corrupt"  # the record could not be read; shown with the reason, never acted on blindly

    @property
    def active(self) -> bool:
        return self in ACTIVE


ACTIVE: frozenset[RunState] = frozenset({RunState.STARTING, RunState.RUNNING})
FINAL: frozenset[RunState] = frozenset({RunState.SUCCEEDED, RunState.CANCELLED, RunState.PRUNED})  # and FAILED, spent
RECORDED = tuple(s for s in RunState if s is not RunState.CORRUPT)  # what a record may say


@dataclass
class RunStatus:
    """Contents of status.json: a run's record (its state changes only through the transitions below)."""

    run_id: str
    state: RunState = RunState.QUEUED  # changed only by store/lifecycle.py's transitions
    attempt: int = 0  # 1 for the first attempt; each restart or resume adds one
    failures: int = 0  # attempts whose command failed (they count against max_restarts)
    preemptions: int = 0  # attempts lost to interruption or a vanished host (free)
    no_shows: int = 0  # attempts whose host never reported (its agent did not start); a few end the run
    quick_losses: int = 0  # attempts in a row whose agent reported, then was lost within QUICK_LOSS_S; a few end it
    host: str = ""  # where the current attempt runs
    started_at: float | None = None  # of the current attempt, unix seconds
    heartbeat: float | None = None  # last sign of life from the agent (None until it first reported)
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str = ""  # why it ended, in words
    log_tail: str = ""  # last lines of the log, for failures
    last_metrics: dict[str, Any] = field(default_factory=dict)  # newest metrics.jsonl line
    first_started_at: float | None = None  # the first claim of the run (wall time to a target counts from it)
    pruned: dict[str, Any] = field(
        default_factory=dict
    )  # `prune:`: the rung, the run's value, the cutoff (state pruned)
    at_rungs: dict[str, float] = field(default_factory=dict)  # `prune:`, from the agent: {rung: the metric on the
    # first line at or past it that carries it}, read from the run's own file (so never from a later line)
    metric_seen: bool | None = None  # `prune:`: whether any line carried the metric (None: not reported)
    # bytes each attempt's agent moved to and from the store: {attempt: [up, down]} (checkpoints, metrics, logs, `data:`
    # staging); carried from attempt to attempt, it prices inter-region transfer (backends/aws/cloud/pricing.py
    # transfer_usd)
    moved: dict[str, list[int]] = field(default_factory=dict)
    code: str = ""  # `workdir:`: the digest of the code snapshot the current (or last) attempt runs
    # the attempt's [work, seconds] at its first and newest metrics line (a RunTask's work_key): its work rate
    work: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = RunState(self.state)  # a record read back (or written by an older orch) holds the string

    @property
    def elapsed(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or self.heartbeat or time.time()
        return max(0.0, end - self.started_at)


# An attempt whose agent reported and then was lost (its host vanished or went silent, no notice) this soon after
# its start, again and again, is an agent or a host that keeps dying, not the spot market (whose reclaims come
# with a notice): after MAX_QUICK_LOSSES in a row the run fails for good instead of starting (and on AWS paying
# for) host after host. A claim that never got a host or a report is not one (no_shows counts hosts that never
# report); a requeue (no capacity) keeps the count.
QUICK_LOSS_S = 600.0
MAX_QUICK_LOSSES = 5


def quick_loss(status: RunStatus) -> bool:
    """The attempt's agent reported, then the attempt ended lost (or is active with its host gone), its last sign
    of life within QUICK_LOSS_S of its start (the command's, once it ran; else the claim's)."""
    if not (status.state in ACTIVE or status.state == RunState.LOST):
        return False
    if status.started_at is None or status.heartbeat is None:
        return False
    return status.heartbeat - status.started_at < QUICK_LOSS_S


class StopReason(_Word):
    """Why an attempt's command is stopped before it ends by itself: what the stop file says, and the
    agent's own reasons. Each knows the state the attempt ends in (dstack's termination reasons)."""

    CANCELLED = "cancelled"  # orch cancel
    PRUNED = "pruned"  # prune: the controller's verdict
    STOPPED = "stopped"  # orch down (and a SIGTERM without a stop file: someone ended the agent)
    LOST = "lost"  # the controller released the attempt's host (its verdict is written first)
    INTERRUPTED = "interrupted"  # the agent handled a spot notice
    TIMEOUT = "timeout"  # the run's timeout_s passed
    SUPERSEDED = "superseded"  # the agent found its record taken over: it stops and writes nothing more
    NODE_FAILED = "node failed"  # node 0: a follower's command exited non-zero

    def to_state(self) -> RunState:
        return _OUTCOME[self]

    @property
    def failure(self) -> bool:
        """Whether an attempt it stops counts against max_restarts."""
        return self in (StopReason.TIMEOUT, StopReason.NODE_FAILED)

    def words(self) -> str:
        return _WORDS[self]

    @classmethod
    def parse(cls, text: str) -> StopReason:
        """A stop file's contents; ValueError naming what it said when it is none of the reasons."""
        try:
            return cls(text.strip())
        except ValueError:
            raise ValueError(
                f"unknown stop reason {text.strip()!r} (one of: {', '.join(r.value for r in cls)})"
            ) from None


_OUTCOME = {
    StopReason.CANCELLED: RunState.CANCELLED,
    StopReason.PRUNED: RunState.PRUNED,
    StopReason.STOPPED: RunState.STOPPED,
    StopReason.LOST: RunState.LOST,
    StopReason.INTERRUPTED: RunState.INTERRUPTED,
    StopReason.TIMEOUT: RunState.FAILED,
    StopReason.SUPERSEDED: RunState.LOST,
    StopReason.NODE_FAILED: RunState.FAILED,
}
_WORDS = {
    StopReason.CANCELLED: "cancelled by orch cancel",
    StopReason.PRUNED: "pruned (successive halving)",
    StopReason.STOPPED: "stopped by orch down",
    StopReason.LOST: "its host was released (the controller called the attempt lost)",
    StopReason.INTERRUPTED: "",  # the notice's own words (how long the checkpoint took) stay
    StopReason.TIMEOUT: "timed out",
    StopReason.SUPERSEDED: "the controller moved on from this attempt (it was called lost); stopped",
    StopReason.NODE_FAILED: "a node of the attempt failed",
}


class Ending(NamedTuple):
    """How an attempt ended, as the agent records it."""

    state: RunState
    reason: str
    failed: bool  # counts against max_restarts


class Impossible(ValueError):
    """A transition from a state the life of a run does not leave that way."""


def _move(
    status: RunStatus, name: str, allowed: frozenset[RunState], to: RunState, reason: str | None, **changes: Any
) -> RunStatus:
    """A new record: `status` moved to `to`, with `changes`; `status` itself is left as it was, so a writer whose
    conditional write is refused still holds the record as the store had it."""
    if status.state not in allowed:
        raise Impossible(f"{status.run_id}: cannot {name} a run that is {status.state} (to {to})")
    return replace(status, state=to, **({} if reason is None else {"reason": reason}), **changes)


_ANY = frozenset(RunState)
_LIVE = _ANY - FINAL - {RunState.CORRUPT}  # may still get another attempt (FAILED with restarts left included)
_AGENT_ENDS = frozenset({RunState.STARTING, RunState.RUNNING, RunState.INTERRUPTED})


# --- the controller's transitions ------------------------------------------------------------


def claim(previous: RunStatus, now: float | None = None) -> RunStatus:
    """A new attempt, claimed before any host exists: a fresh record that carries the run's counts.
    An attempt that was lost or interrupted (or active with its host gone) counts as a preemption."""
    if previous.state not in _LIVE:
        raise Impossible(f"{previous.run_id}: cannot claim a new attempt of a run that is {previous.state}")
    now = time.time() if now is None else now
    return RunStatus(
        run_id=previous.run_id,
        state=RunState.STARTING,
        attempt=previous.attempt + 1,
        failures=previous.failures,
        preemptions=previous.preemptions + (1 if preempted(previous) else 0),
        no_shows=previous.no_shows,
        quick_losses=_quick_losses(previous),
        started_at=now,
        first_started_at=previous.first_started_at or now,
        pruned=previous.pruned,
        moved=previous.moved,
    )


def recover(corrupt: RunStatus, attempt: int) -> RunStatus:
    """A record that cannot be read, of a run no host runs: taken as attempt `attempt` lost (the newest one the store
    has a log of), so that a claim gives the run a new attempt under a number of its own. The counts it held are
    unreadable: they start again."""
    if corrupt.state != RunState.CORRUPT:
        raise Impossible(f"{corrupt.run_id}: cannot recover a run that is {corrupt.state} (its record reads)")
    return RunStatus(run_id=corrupt.run_id, state=RunState.LOST, attempt=attempt, reason=corrupt.reason)


def _quick_losses(previous: RunStatus) -> int:
    if quick_loss(previous):
        return previous.quick_losses + 1
    return previous.quick_losses if previous.state == RunState.QUEUED else 0  # requeued: the count stands


def preempted(status: RunStatus) -> bool:
    """The attempt ended without its command's say: a new attempt resumes it, free."""
    return status.state in ACTIVE or status.state in (RunState.INTERRUPTED, RunState.LOST)


def requeue(status: RunStatus, reason: str) -> RunStatus:
    """The claimed attempt never got a host (no capacity): back to how it was before the claim."""
    return _move(status, "requeue", ACTIVE, RunState.QUEUED, reason, attempt=status.attempt - 1)


def fail(status: RunStatus, reason: str, failure: bool = True, now: float | None = None) -> RunStatus:
    """The controller's verdict that the attempt failed (provisioning failed; hosts that never reported)."""
    return _move(
        status,
        "fail",
        ACTIVE,
        RunState.FAILED,
        reason,
        failures=status.failures + (1 if failure else 0),
        finished_at=time.time() if now is None else now,
    )


def give_up(status: RunStatus, reason: str, now: float | None = None) -> RunStatus:
    """Instead of a new attempt: MAX_QUICK_LOSSES attempts in a row were lost soon after their start (failed for
    good; not a failure of the command, so max_restarts is not what ended it)."""
    return _move(
        status,
        "give up",
        ACTIVE | {RunState.LOST},
        RunState.FAILED,
        reason,
        quick_losses=status.quick_losses + 1,
        finished_at=time.time() if now is None else now,
    )


def lose(status: RunStatus, reason: str, now: float | None = None) -> RunStatus:
    """Its host vanished or went silent: the attempt is over; a new one resumes the run."""
    return _move(status, "lose", ACTIVE, RunState.LOST, reason, finished_at=time.time() if now is None else now)


def prune(status: RunStatus, reason: str, pruned: dict[str, Any], now: float | None = None) -> RunStatus:
    return _move(
        status, "prune", _LIVE, RunState.PRUNED, reason, pruned=pruned, finished_at=time.time() if now is None else now
    )


def cancel(status: RunStatus, reason: str, now: float | None = None) -> RunStatus:
    """For good: `orch cancel` (whatever the run did), or a budget reached before it started."""
    now = time.time() if now is None else now
    return _move(status, "cancel", _ANY - {RunState.CANCELLED}, RunState.CANCELLED, reason, finished_at=now)


def reopen(status: RunStatus, reason: str) -> RunStatus:
    """A run the budget cancelled before it started, queued again by a relaunch that raised the budget."""
    return _move(status, "reopen", frozenset({RunState.CANCELLED}), RunState.QUEUED, reason, finished_at=None)


def stop(status: RunStatus, reason: str, now: float | None = None) -> RunStatus:
    """`orch down` on a claim: resumable by the next launch."""
    return _move(status, "stop", ACTIVE, RunState.STOPPED, reason, finished_at=time.time() if now is None else now)


# --- the agent's transitions ---------------------------------------------------------------------


def start(
    status: RunStatus, attempt: int, host: str, reason: str, now: float | None = None, code: str = ""
) -> RunStatus:
    """The agent's first report on its host: alive, restoring (before any slow work); `code`: the snapshot it runs."""
    now = time.time() if now is None else now
    return _move(
        status,
        "start",
        _LIVE,
        RunState.STARTING,
        reason,
        attempt=attempt,
        host=host,
        no_shows=0,
        heartbeat=now,
        code=code,
    )


def run(status: RunStatus, attempt: int, host: str, now: float | None = None) -> RunStatus:
    """The command starts: the attempt's clock starts over, nothing of an earlier ending stays."""
    now = time.time() if now is None else now
    return _move(
        status,
        "run",
        frozenset({RunState.STARTING}),
        RunState.RUNNING,
        "",
        attempt=attempt,
        host=host,
        started_at=now,
        heartbeat=now,
        finished_at=None,
        exit_code=None,
        log_tail="",
        work=[],
    )


def interrupt(status: RunStatus, reason: str, now: float | None = None) -> RunStatus:
    """A spot notice handled: the checkpoint is in the store; the command is being stopped."""
    return _move(
        status, "interrupt", ACTIVE, RunState.INTERRUPTED, reason, heartbeat=time.time() if now is None else now
    )


def finish(
    status: RunStatus, ending: Ending, exit_code: int | None, log_tail: str, now: float | None = None
) -> RunStatus:
    """How the attempt ended, as its agent saw it (an interrupted attempt keeps the notice's words)."""
    reason = ending.reason or (status.reason if ending.state == RunState.INTERRUPTED else "")
    now = time.time() if now is None else now
    return _move(
        status,
        "finish",
        _AGENT_ENDS,
        ending.state,
        reason,
        finished_at=now,
        heartbeat=now,
        exit_code=exit_code,
        log_tail=log_tail,
        failures=status.failures + (1 if ending.failed else 0),
    )
