"""What the controller and `orch status` show of a sweep: one view per run, and a pass's progress."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.money import usd as usd  # re-exported: the control layer and the CLI read it here
from orchestrator.store.status import ACTIVE, FAILED, LOST, QUEUED, RunState, RunStatus

LIVE_ROWS_FINISHED = 10  # the live table shows every active run and this many of the newest finished ones


@dataclass
class RunView:
    """One row of the live table (and of `orch status --json`)."""

    run_id: str
    state: RunState  # as in status.json (an active record without a host shows as lost)
    attempt: int
    failures: int
    preemptions: int
    elapsed: float | None  # seconds in the current/last attempt
    metrics: dict[str, object]  # newest metrics line
    reason: str = ""  # why it failed or stopped
    exit_code: int | None = None
    log_tail: str = ""
    final: bool = False  # no further attempt will be made
    finished_at: float | None = None  # when its last attempt ended (orders the newest finished runs)
    reached: bool | None = None  # with `target:`: whether a metrics line met it (None: no target)
    region: str = ""  # aws: where its current (or last) attempt runs, from the cost ledger ("" elsewhere)
    why: str = ""  # aws: its current attempt's pool and how that pool ranked when bought (`aws.choose`)

    def __post_init__(self) -> None:
        self.state = RunState(self.state)  # a summary's row, read back, holds the string

    @property
    def live(self) -> bool:
        """Neither final nor waiting in the queue: its record may change at any moment."""
        return not self.final and self.state != QUEUED


@dataclass
class Progress:
    """What one pass saw and did."""

    sweep: str
    runs: list[RunView] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # run ids started in this pass
    spend_usd: float = 0.0  # realized cost so far (aws)
    budget_usd: float | None = None  # the sweep's budget, if any
    target: dict | None = None  # the `target:` the runs' `reached` marks were computed against (summary.target_of)
    deadline: Any = None  # `deadline:`: the pass's schedule as shown (control/deadline.py: DeadlineView)

    @property
    def done(self) -> bool:
        return all(r.final for r in self.runs)

    def count(self, state: str) -> int:
        return sum(1 for r in self.runs if r.state == state)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    @property
    def failed(self) -> list[RunView]:
        return [r for r in self.runs if r.final and r.state == FAILED]

    def shown(self, every: bool = False) -> list[RunView]:
        """The rows a live table shows: every active run and the newest finished ones (all rows with `every`)."""
        if every or len(self.runs) <= 2 * LIVE_ROWS_FINISHED + 20:
            return list(self.runs)
        live = [r for r in self.runs if r.live]
        done = sorted((r for r in self.runs if r.final), key=lambda r: r.finished_at or 0.0)[-LIVE_ROWS_FINISHED:]
        keep = {id(r) for r in live + done}
        return [r for r in self.runs if id(r) in keep]


def view_of(status: RunStatus, has_host: bool, final: bool) -> RunView:
    """A run's row from its record: an active record without a host shows as lost."""
    lost = status.state in ACTIVE and not has_host
    return RunView(
        run_id=status.run_id,
        state=LOST if lost else status.state,
        attempt=status.attempt,
        failures=status.failures,
        preemptions=status.preemptions,
        elapsed=status.elapsed,
        metrics=status.last_metrics,
        reason=status.reason,
        exit_code=status.exit_code,
        log_tail=status.log_tail,
        final=final,
        finished_at=status.finished_at,
    )


def with_whys(views: Iterable[RunView], whys: dict[str, dict[int, str]]) -> None:
    """Each view's `why` (`whys`: run -> {attempt: where and why}, the backend's cost ledger): its current attempt's."""
    for view in views:
        view.why = (whys.get(view.run_id) or {}).get(view.attempt, "")


def with_places(views: Iterable[RunView], places: dict[str, dict[int, str]]) -> None:
    """Each view's region (`places`: run -> {attempt: region}, the backend's cost ledger): its current attempt's,
    else its newest one's."""
    for view in views:
        attempts = places.get(view.run_id)
        if attempts:
            view.region = attempts.get(view.attempt) or attempts[max(attempts)]
