"""control/deadline.py: what a deadline shows (status's line, read back from summary.json), what a launch says and
refuses of it, and whether collect calls it met — on hand-made sweeps whose answers can be worked out."""

from __future__ import annotations

import dataclasses
import textwrap

from orchestrator.backends.registry import load_sweep
from orchestrator.control import deadline as d
from orchestrator.control.schedule import RunWork, finish, plan
from orchestrator.control.views import RunView
from tests.unit.sweep.test_deadline import AWS as SWEEP

NOW = 1_000_000.0


def view(**over) -> d.DeadlineView:
    base = dict(
        deadline=NOW + 3600, now=NOW, on_schedule=True, behind_s=0.0, shortfall_s=0.0, on_demand_runs=0,
        work_left_s=600.0, switch_at=None, run_length_s=600.0, length_from="assumed", switch_s=60.0, runs_left=1,
        running=1,
    )  # fmt: skip
    return d.DeadlineView(**{**base, **over})


def test_the_status_line_says_out_of_reach_none_running_and_missed_while_runs_go_on():
    assert view().line(NOW).endswith("on schedule, all on spot")
    assert view(running=0).line(NOW).endswith("on schedule, none running")
    # no run waits (nothing to switch), yet even all on-demand it ends late: not "on schedule"
    assert "out of reach: even all on on-demand, about 5m late" in view(shortfall_s=300, on_schedule=False).line(NOW)
    # past the deadline with a run still going whose work left counts 0 (it outlasted the longest finished run)
    assert "missed by 2m" in view(work_left_s=0.0, runs_left=1).line(NOW + 3600 + 120)


def test_a_view_reads_back_and_one_an_earlier_orch_wrote_reads_with_the_new_fields_at_their_defaults():
    doc = dataclasses.asdict(view(runs_left=3, running=2))
    assert d.read(doc) == view(runs_left=3, running=2)
    old = {k: v for k, v in doc.items() if k not in ("runs_left", "running")}
    assert d.read(old) == view(runs_left=0, running=0)
    assert d.read({**doc, "now": float("nan")}) is None and d.read([1]) is None


def test_the_plan_counts_every_hosted_run_when_more_run_than_max_parallel_and_moves_none_out_of_reach():
    # three runs hosted on two slots (a relaunch lowered max_parallel): the waiting run starts when two have ended
    runs = [RunWork("a", 100, True, True), RunWork("b", 200, True, True), RunWork("c", 300, True, True)]
    assert finish([*runs, RunWork("d", 50)], 2, NOW, 10, NOW) == NOW + 300  # d: from b's end (200) to 260; c: 300
    assert finish([*runs, RunWork("d", 150)], 2, NOW, 10, NOW) == NOW + 360  # d: 200 + 150 + 10
    late = plan([RunWork("a", 600, hosted=True)], 1, deadline=NOW + 300, now=NOW, switch_s=60)
    assert late.shortfall_s > 0 and not late.on_schedule and late.move == frozenset()  # a move would only add to it


AWS = SWEEP.replace("timeout_minutes: 30", "timeout_minutes: 10")  # one run of 10 min


def _sweep(tmp_path, deadline: str):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(AWS) + f"deadline: {deadline}\n")
    return load_sweep(p)


def _queued(sweep) -> list[RunView]:
    return [RunView(r.run_id, "queued", 0, 0, 0, None, {}) for r in sweep.runs]


def test_a_launch_refuses_a_deadline_that_leaves_no_margin_and_says_a_deadline_was_added(tmp_path):
    # one run of 10 min (assumed: timeout_minutes) and a 60 s move: 660 s on on-demand from now
    tight = _sweep(tmp_path, "11m30s")  # it would end 30 s before it: under the margin of one more move
    _, problem = d.at_launch(tight, None, _queued(tight), 60.0, NOW)
    assert "s.yaml:7: deadline: leaves no margin" in problem and "end 30s before it" in problem, problem
    roomy = _sweep(tmp_path, "12m30s")  # 90 s to spare: a move and more
    lines, problem = d.at_launch(roomy, None, _queued(roomy), 60.0, NOW)
    assert problem == "" and any("1 runs left, 10.0 min each, assumed" in line for line in lines), lines
    kept = {"launched_at": NOW - 5, "spec": {"deadline": "11m"}}  # a relaunch keeps it: told, not refused
    said, problem = d.at_launch(_sweep(tmp_path, "11m"), kept, _queued(roomy), 60.0, NOW)
    assert problem == "" and "out of reach: even all on on-demand from now" in said[-1], said
    record = {"launched_at": NOW - 5, "spec": {}}  # a relaunch of a sweep first launched without a deadline
    added, _ = d.at_launch(_sweep(tmp_path, "2d"), record, _queued(roomy), 60.0, NOW)
    assert added[0].startswith("deadline added: 2d ("), added


def test_collect_says_met_with_the_failures_and_not_met_when_the_budget_stopped_runs():
    assert d.outcome(NOW, [NOW - 120], True, NOW) == "met, 2m to spare"
    assert d.outcome(NOW, [NOW - 120, NOW - 60], True, NOW, failures=2) == "met, 60s to spare (2 run(s) failed)"
    assert d.outcome(NOW, [NOW - 60], True, NOW, unrun=1).startswith("not met: 1 run(s) never ran")
