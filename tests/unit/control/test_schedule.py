"""control/schedule.py: the deadline's rule (Uniform Progress), on hand-made sweeps whose answer can be worked out."""

from __future__ import annotations

import pytest

from orchestrator.control.schedule import PASS_SLACK_S, RunWork, finish, plan, run_length

NOW = 1_000_000.0


def test_all_on_demand_from_a_moment_fills_the_slots_that_free_first_shortest_first():
    runs = [RunWork("a", 100, hosted=True), RunWork("b", 50), RunWork("c", 30)]
    # two slots: a holds one until NOW+110 (a spot run counts its move); c then b take the slots as they free
    assert finish(runs, 2, NOW, 10, NOW) == NOW + 110  # c on the free slot (40), b after it (100), a at 110
    assert finish(runs, 2, NOW, 10, NOW + 100) == NOW + 110 + 60  # from NOW+100: c at 100 -> 140, b at 110 -> 170
    assert finish(runs, 2, NOW, 10, NOW, keep=True) == NOW + 100  # a kept as it runs, no move


def test_spot_only_while_the_work_still_fits_then_on_demand_for_the_runs_waiting():
    runs = [RunWork("a", 600), RunWork("b", 600)]
    easy = plan(runs, 2, deadline=NOW + 3600, now=NOW, switch_s=60)
    assert easy.on_demand == frozenset() and easy.on_schedule and easy.shortfall_s == 0
    # the deadline, less the margin (60), less the run and its move (660)
    assert easy.switch_at == pytest.approx(NOW + 3600 - 60 - 660, abs=0.01)
    tight = plan(runs, 2, deadline=NOW + 3600, now=easy.switch_at - PASS_SLACK_S / 2, switch_s=60)
    assert tight.on_demand == {"a", "b"} and tight.on_schedule


def test_a_hosted_run_is_not_moved_while_a_reclaim_of_it_would_not_make_the_sweep_late():
    runs = [RunWork("a", 600, hosted=True), RunWork("b", 600, hosted=True, on_demand=True)]
    s = plan(runs, 2, deadline=NOW + 2000, now=NOW, switch_s=60)
    assert s.on_demand == frozenset() and s.move == frozenset() and s.switch_at is None  # nothing waits
    late = plan(runs, 2, deadline=NOW + 700, now=NOW, switch_s=60)
    # a reclaim of a now would cost 60 s of lost work and a 60 s move: 720 s > the 640 s left before the margin
    assert late.move == {"a"}  # b is on on-demand already: never moved


def test_behind_and_a_deadline_that_cannot_be_met_say_by_how_much():
    runs = [RunWork("a", 600), RunWork("b", 600)]
    late = plan(runs, 1, deadline=NOW + 1000, now=NOW, switch_s=50)
    # all on-demand now, one slot: 650 + 650 = 1300 s, 300 s after the deadline
    assert late.shortfall_s == pytest.approx(300)
    assert late.behind_s == pytest.approx(350)  # and 50 s more of the margin
    assert late.on_demand == {"a", "b"}  # every waiting run goes on-demand as a slot frees


def test_the_run_length_is_measured_once_a_run_finished():
    assert run_length([], 600)[0] == 600 and "assumed" in run_length([], 600)[1]
    assert run_length([100, 250], 600) == (250, "measured: the longest of 2 finished run(s)")


def test_a_run_on_on_demand_goes_back_to_spot_only_a_move_ahead_and_with_work_worth_a_move():
    on_demand = [RunWork("a", 3000, hosted=True, on_demand=True)]
    assert plan(on_demand, 1, deadline=NOW + 100_000, now=NOW, switch_s=60).back == {"a"}
    # waiting again it needs 3060 s before the margin: the switch moment NOW+80 is a move (60) and a pass (10) ahead
    assert plan(on_demand, 1, deadline=NOW + 3200, now=NOW, switch_s=60).back == {"a"}
    assert plan(on_demand, 1, deadline=NOW + 3150, now=NOW, switch_s=60).back == frozenset()  # NOW+30: not enough
    short = [RunWork("a", 150, hosted=True, on_demand=True)]  # under 3 moves of work left: not worth a move
    assert plan(short, 1, deadline=NOW + 100_000, now=NOW, switch_s=60).back == frozenset()


def test_a_run_waiting_for_a_host_counts_its_work_at_the_slowest_measured_types_pace():
    from orchestrator.control.deadline import works
    from orchestrator.control.views import RunView

    def view(rid: str, elapsed: float) -> RunView:
        return RunView(rid, "running", 1, 0, 0, None, {"elapsed_s": elapsed})

    views = [view("on-host", 100), view("waiting", 100), view("new", 0)]
    scale = {"": 2.0, "on-host": 3.0, "waiting": 1.5}
    left = {w.run_id: w.left_s for w in works(views, 400, {"on-host"}, {}, scale)}
    # on its host at that host's pace; waiting, at the slowest's (its last type's factor); not started: the fastest's
    assert left == {"on-host": 300, "waiting": 450, "new": 800}
    bad = {w.run_id: w.left_s for w in works(views, 400, set(), {}, {"": float("nan"), "waiting": 0.5})}
    assert bad == {"on-host": 300, "waiting": 300, "new": 400}  # a factor that is no number or under 1: none
