"""What a relaunch that raises `budget_usd` or `max_restarts` gives back (sweep/record.py lets both change).

The runs the budget cancelled before they started are queued again, and the runs that failed for good are followed
again, so that the first pass retries those the new `max_restarts` allows. Their records are read once, at such a
relaunch only (one LIST, then a read per run); a relaunch that raises neither reads nothing here.
"""

from __future__ import annotations

from typing import Any

from orchestrator.control import summary
from orchestrator.control.table import read_many
from orchestrator.store import lifecycle as life
from orchestrator.store.base import Store
from orchestrator.store.status import CANCELLED, FAILED, RunStatus, recorded_runs, update_status
from orchestrator.sweep.spec import Sweep

BUDGET_STOP = "not started: budget"  # how the reason the controller gives a run the budget cancelled begins


def _raised(before: dict[str, Any], sweep: Sweep) -> tuple[bool, bool]:
    """(more money, more restarts): the file's budget above the recorded one (or none now), its max_restarts above."""
    budget, restarts = before.get("budget_usd"), before.get("max_restarts")
    money = isinstance(budget, (int, float)) and (sweep.spec.budget_usd is None or sweep.spec.budget_usd > budget)
    return money, isinstance(restarts, int) and sweep.spec.max_restarts > restarts


def budget_stopped(status: RunStatus) -> bool:
    """A run the budget cancelled before it started."""
    return status.state == CANCELLED and status.reason.startswith(BUDGET_STOP)


def _reopen(status: RunStatus) -> RunStatus | None:
    return life.reopen(status, "queued again: budget raised") if budget_stopped(status) else None


def give_back(store: Store, sweep: Sweep, before: dict[str, Any]) -> list[str]:
    """Queue again what the old budget cancelled and follow what failed for good, as far as the file now raises them;
    returns those runs."""
    money, restarts = _raised(before, sweep)
    if not (money or restarts):
        return []
    name = sweep.spec.name
    present = recorded_runs(store, name)
    records = read_many(store, name, [run.run_id for run in sweep.runs if run.run_id in present])
    back = []
    for rid, (status, _) in records.items():
        if money and budget_stopped(status):
            if update_status(store, name, rid, _reopen) is not None:
                back.append(rid)
        elif restarts and status.state == FAILED:
            back.append(rid)
    for rid in back:  # the summary holds them final: the first pass reads them instead
        summary.touch(store, name, rid)
    return back
