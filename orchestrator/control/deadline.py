"""`deadline:` in the controller: each pass, the runs' work left from their newest metrics lines, the plan
(control/schedule.py), and what the backend is told to buy. What status, the notifications and collect show of it
is the DeadlineView a pass publishes."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.contract import finite
from orchestrator.control.schedule import RunWork, Schedule, plan, run_length
from orchestrator.control.views import RunView
from orchestrator.store.status import SUCCEEDED
from orchestrator.sweep import deadline as deadlines
from orchestrator.sweep.load import located
from orchestrator.sweep.spec import Sweep, SweepSpec

log = logging.getLogger("orch.control")

CLOCKS = ("elapsed_s", "elapsed")  # a run's own clock in its metrics lines: its work done, in seconds (host/attempt.py
# adds `time` for a rate: a Unix timestamp measures a rate between two lines, never the work done)
DEFAULT_SWITCH_S = 300.0  # a boot and a restore, until the sweep has measured its own (backend.switch_s())


@dataclass
class DeadlineView:
    """What one pass's schedule says, for `orch status`, notifications and collect."""

    deadline: float  # seconds since the epoch
    now: float  # when the pass saw it
    on_schedule: bool
    behind_s: float
    shortfall_s: float
    on_demand_runs: int  # runs on on-demand instances now
    work_left_s: float
    switch_at: float | None  # the latest moment a waiting run moves to on-demand (None: nothing waits)
    run_length_s: float
    length_from: str  # measured or assumed (schedule.run_length)
    switch_s: float
    runs_left: int = 0  # runs not final (a run past the longest finished one has no work left counted, yet goes on)
    running: int = 0  # runs on a host now

    def line(self, now: float) -> str:
        """`orch status`'s line: deadline, and on schedule or behind by how much, with the on-demand runs."""
        when = deadlines.shown(self.deadline)
        if self.deadline <= now and (self.work_left_s > 0 or self.runs_left):
            state = f"missed by {deadlines.span(now - self.deadline)}"
        elif self.shortfall_s > 0:
            state = f"out of reach: even all on on-demand, about {deadlines.span(self.shortfall_s)} late"
        elif self.on_schedule:
            state = "on schedule"
        else:
            state = f"behind by {deadlines.span(self.behind_s)}"
        if self.on_demand_runs:
            od = f", {self.on_demand_runs} run(s) on on-demand"
        else:
            od = ", all on spot" if self.running else ", none running"
        return f"deadline {when} ({deadlines.span(max(0.0, self.deadline - now))} left): {state}{od}"


def read(doc: object) -> DeadlineView | None:
    """A DeadlineView from summary.json's `deadline` (None when absent or not one: it is input)."""
    if not isinstance(doc, dict):
        return None
    try:  # (a field with a default may be missing: a summary an earlier orch wrote)
        view = DeadlineView(**{k: doc[k] for k in DeadlineView.__dataclass_fields__ if k in doc})
    except (KeyError, TypeError):
        return None
    numbers = (view.deadline, view.now, view.behind_s, view.shortfall_s, view.work_left_s, view.run_length_s)
    return view if all(finite(n) is not None for n in numbers) else None


def progress_s(view: RunView) -> float:
    """A run's work done, in seconds of its own clock (its newest metrics line), 0 without one."""
    for key in CLOCKS:
        value = finite(view.metrics.get(key)) if view.metrics else None
        if value is not None:
            return max(0.0, value)
    return 0.0


def moment(spec: SweepSpec, launched_at: float) -> float | None:
    return deadlines.parse(spec.deadline).moment(launched_at) if spec.deadline else None


def works(
    views: Iterable[RunView], length_s: float, hosted: set[str], markets: dict[str, str], scale: dict[str, float]
) -> list[RunWork]:
    """Each run not final, its work left: on its host at that host's pace; waiting for one, at the slowest measured
    type's (`scale`: Backend.work_scale; a run not started yet takes the fastest type's factor, "")."""
    return [
        RunWork(
            v.run_id,
            max(0.0, length_s - progress_s(v)) * (1.0 if v.run_id in hosted else _factor(scale, v.run_id)),
            hosted=v.run_id in hosted,
            on_demand=markets.get(v.run_id) == "on-demand",
        )
        for v in views
        if not v.final
    ]


def _factor(scale: dict[str, float], run_id: str) -> float:
    found = finite(scale.get(run_id, scale.get("", 1.0)))
    return found if found is not None and found >= 1.0 else 1.0


def schedule(
    spec: SweepSpec,
    at: float,
    views: list[RunView],
    hosted: set[str],
    markets: dict[str, str],
    switch_s: float | None,
    now: float,
    scale: dict[str, float] | None = None,
) -> tuple[Schedule, DeadlineView]:
    """This pass's schedule, and what it shows (`scale`: works)."""
    finished = [progress_s(v) for v in views if v.final and v.state == SUCCEEDED and progress_s(v) > 0]
    length, why = run_length(finished, (spec.timeout_minutes or 0) * 60)
    switch = switch_s if switch_s is not None else DEFAULT_SWITCH_S
    s = plan(works(views, length, hosted, markets, scale or {}), spec.max_parallel, at, now, switch)
    view = DeadlineView(
        deadline=at,
        now=now,
        on_schedule=s.on_schedule,
        behind_s=s.behind_s,
        shortfall_s=s.shortfall_s,
        on_demand_runs=sum(1 for rid in hosted if markets.get(rid) == "on-demand"),
        work_left_s=s.work_left_s,
        switch_at=s.switch_at,
        run_length_s=length,
        length_from=why,
        switch_s=switch,
        runs_left=sum(1 for v in views if not v.final),
        running=len(hosted),
    )
    return s, view


def at_launch(
    sweep: Sweep, record: dict | None, views: list[RunView], switch_s: float, now: float
) -> tuple[list[str], str]:
    """What a launch (and its dry run) says of the deadline, and why it refuses it ("" when it does not): a time in
    the past, or one the work cannot meet even all on-demand from now — checked at the first launch and whenever the
    deadline moved; a sweep continued past a deadline it kept is told it missed it, not refused."""
    spec = sweep.spec
    if not spec.deadline:
        return [], ""
    launched = record.get("launched_at") if isinstance(record, dict) else None
    launched = float(launched) if isinstance(launched, (int, float)) else now
    recorded = ((record or {}).get("spec") or {}).get("deadline") if isinstance(record, dict) else None
    at = deadlines.parse(spec.deadline).moment(launched)
    where = located(sweep.path, ("deadline",))
    lines = []
    moved = record is not None and recorded != spec.deadline
    if moved and recorded:
        before = f"{recorded} ({deadlines.shown(deadlines.parse(recorded).moment(launched))})"
        lines.append(f"deadline moved: was {before}, now {spec.deadline} ({deadlines.shown(at)})")
    elif moved:
        lines.append(f"deadline added: {spec.deadline} ({deadlines.shown(at)})")
    checked = record is None or moved
    if at <= now:
        if checked:
            return lines, f"{where}: {spec.deadline!r} is {deadlines.span(now - at)} in the past; give a later time"
        lines.append(f"deadline {deadlines.shown(at)} passed {deadlines.span(now - at)} ago: the runs left go on")
        return lines, ""
    s, view = schedule(spec, at, views, set(), {}, switch_s, now)
    each = f"{view.run_length_s / 60:.1f} min"
    left = sum(1 for v in views if not v.final)
    lines.append(
        f"deadline {deadlines.shown(at)} ({deadlines.span(at - now)} from now): {left} runs left, {each} each, "
        f"{view.length_from}"
    )
    if s.switch_at is not None and s.switch_at >= now:
        lines.append(
            f"  spot until {deadlines.shown(s.switch_at)}: the runs still waiting then would move to on-demand "
            f"(max_parallel {spec.max_parallel}; {switch_s:.0f} s a move, and one more as margin; the cost bound is "
            "priced at the dearer market)"
        )
    fix = "Give a later deadline, raise max_parallel, or lower timeout_minutes"
    shape = f"{left} runs x {each}; max_parallel {spec.max_parallel}; {switch_s:.0f} s to start each"
    if s.shortfall_s > 0 and not checked:  # a kept deadline: the sweep goes on, told so
        lines.append(f"  out of reach: even all on on-demand from now the last run would end about "
                     f"{deadlines.span(s.shortfall_s)} after it; the runs go on")  # fmt: skip
    if s.shortfall_s > 0 and checked:
        return lines, (
            f"{where}: cannot be met even with every run on on-demand from now: the last would end about "
            f"{deadlines.span(s.shortfall_s)} after it ({shape}). {fix}"
        )
    if s.behind_s > 0 and checked:  # it fits, but without the margin of one move for a reclaim at the last moment
        return lines, (
            f"{where}: leaves no margin: with every run on on-demand from now the last would end "
            f"{deadlines.span(max(0.0, switch_s - s.behind_s))} before it, less than one more move ({shape}). {fix}"
        )
    return lines, ""


def markets_bought(ledger: dict, on_demand_of) -> dict:
    """`orch collect` with a deadline: the dollars spent per market against two estimates from the same instance-hours
    — all on spot (an on-demand hour at the spot price its type was bought at in this sweep, else a third of it, as
    orch prices on-demand at 3x spot where it knows no price) and all on on-demand (`on_demand_of(type, spot, region)`).
    """
    spent = {"spot": 0.0, "on-demand": 0.0}
    hours = {"spot": 0.0, "on-demand": 0.0}
    all_spot = all_od = 0.0
    entries = [e for e in ledger.values() if isinstance(e, dict) and not e.get("role")]
    spot_of = {e.get("type"): finite(e.get("price_per_h")) for e in entries if e.get("market") == "spot"}
    for e in entries:
        market, price = e.get("market"), finite(e.get("price_per_h")) or 0.0
        start, end = finite(e.get("start")), finite(e.get("end"))
        if market not in spent or start is None or end is None:
            continue
        h = max(0.0, end - start) / 3600
        spent[market] += h * price
        hours[market] += h
        if market == "spot":
            all_spot += h * price
            all_od += h * (on_demand_of(e.get("type"), price, str(e.get("region") or "")) or price * 3)
        else:
            all_spot += h * (spot_of.get(e.get("type")) or price / 3)
            all_od += h * price
    return {"usd": spent, "hours": hours, "all_spot_usd": all_spot, "all_on_demand_usd": all_od}


def outcome(at: float, finished: list[float | None], done: bool, now: float, unrun: int = 0, failures: int = 0) -> str:
    """Whether the deadline was met: by the last run's end, once every run is final; not met while runs the budget
    stopped never ran (`budget_usd` wins over a deadline: their work was not done, however early the rest ended)."""
    if not done:
        return (
            "not yet decided (runs still going)"
            if now < at
            else f"missed: runs still going {deadlines.span(now - at)} after it"
        )
    if unrun:
        return f"not met: {unrun} run(s) never ran, stopped by budget_usd (the budget wins over the deadline)"
    last = max((f for f in finished if f is not None), default=None)
    if last is None:
        return "met (no run ran)"
    failed = f" ({failures} run(s) failed)" if failures else ""
    said = f"met, {deadlines.span(at - last)} to spare" if last <= at else f"missed by {deadlines.span(last - at)}"
    return said + failed
