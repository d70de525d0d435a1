"""orch's invariants under random sweeps and faults (tests/harness/machine.py says what a scenario is).

The bounded profile runs in the suite: the same scenarios every time (a fixed seed), so a red suite is a
change of orch's, never the dice. `ORCH_HARNESS_PROFILE=long scripts/test.sh tests/harness --timeout 3600` explores new
ones and keeps every failure it finds in tests/harness/hypothesis-db (commit it: each run replays it
first). Each defect being fixed elsewhere (machine.KNOWN) has a strict xfail here: a minimal scripted
scenario with that check turned on, which passes (and so fails as XPASS) once the fix lands.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.stateful import run_state_machine_as_test

from orchestrator.control.actions import cancel_run
from orchestrator.errors import OrchError
from orchestrator.store.layout import CHECKPOINTS_DIR, MANIFEST_FILE
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import read_status
from tests.harness.lease_machine import LeaseHarness
from tests.harness.machine import CLASHES, LINES, Harness, Scenario
from tests.harness.sim import SimBackend, default_plan

DB = DirectoryBasedExampleDatabase(str(Path(__file__).parent / "hypothesis-db"))
_COMMON = dict(deadline=None, database=DB, suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("bounded", max_examples=15, stateful_step_count=40, **_COMMON)
settings.register_profile("long", max_examples=2000, stateful_step_count=60, **_COMMON)
BOUNDED_SEED = 20261203
PROFILE = os.environ.get("ORCH_HARNESS_PROFILE", "bounded")


# 7 s alone; a loaded suite (four workers on two cores) once took over 300 s. The long profile runs with
# `--timeout 3600` (README: Tests).
@pytest.mark.timeout(900)
def test_invariants_hold_under_random_sweeps_and_faults():
    # bounded: the same scenarios every run (a fixed seed), after the failures the database keeps
    machine = Harness if PROFILE == "long" else seed(BOUNDED_SEED)(Harness)
    chosen = settings.get_profile(PROFILE)
    if os.environ.get("ORCH_HARNESS_SHRINK") == "0":  # a verdict without the minutes shrinking takes (mutation runs)
        chosen = settings(chosen, phases=[p for p in Phase if p is not Phase.shrink])
    run_state_machine_as_test(machine, settings=chosen)


@pytest.mark.timeout(600)
def test_the_lease_keeps_its_promises_under_random_controllers_restarts_stops_and_pauses():
    # controllers on three machines, supervisors' restarts, `orch down`, a corrupted record, pauses around 3, 15 and
    # 120 s (tests/harness/lease_machine.py); the bounded profile runs more steps: a step is a few file operations
    machine = LeaseHarness if PROFILE == "long" else seed(BOUNDED_SEED)(LeaseHarness)
    chosen = settings(settings.get_profile(PROFILE), max_examples=300 if PROFILE == "bounded" else 5000)
    run_state_machine_as_test(machine, settings=chosen)


# --- scripted scenarios: a known defect each, its check on -----------------------------------------------


def scripted(scenario: Scenario, kinds, steps, checked, then=None):
    """Run `steps` (rule names, or (name, kwargs)) on a fresh machine, every invariant after each step; then `then`
    (the machine), before its folders go."""
    machine = Harness()
    machine.checked = Harness.checked | set(checked)
    try:
        machine.setup(scenario=scenario, kinds=kinds)
        machine.check_all()
        for step in steps:
            name, kwargs = (step, {}) if isinstance(step, str) else step
            getattr(machine, name)(**kwargs)
            machine.check_all()
        if then is not None:
            then(machine)
        return machine
    finally:
        machine.teardown()


def grid(**over) -> Scenario:
    base = dict(
        search=None,
        points=2,
        seeds=1,
        max_parallel=2,
        max_restarts=0,
        prune=False,
        target=False,
        budget=None,
        nodes=1,
        pack=1,
        value="last",
    )
    return Scenario(**{**base, **over})


PASS_AND_TICK = ["controller_pass", ("agents_tick", {"ticks": 1})]


def test_a_sweep_without_faults_ends_with_every_run_succeeded_and_in_the_store():
    m = scripted(grid(), ["ok"] * 12, PASS_AND_TICK * 8 + ["controller_pass", "loop_ends"], checked=set())
    assert m.progress is not None and m.progress.done
    assert {v.state for v in m.progress.runs} == {"succeeded"}


@pytest.mark.parametrize("name", CLASHES)
def test_a_param_named_like_a_collect_column_is_under_param_and_never_overwrites_the_column(name):
    m = scripted(grid(clash=name), ["ok"] * 12, PASS_AND_TICK * 8 + ["controller_pass", "loop_ends"], checked=set())
    assert m.results_checked == 1  # the loop ended, and runs.csv and runs.json were checked


def test_a_pruned_run_keeps_its_folder_and_log_in_the_store():
    scripted(grid(prune=True), ["ok"] * 12, PASS_AND_TICK * 8, checked={10})


def test_a_run_cancelled_while_its_host_boots_keeps_the_log_of_its_command():
    # found by the random machine (its stored failure): the command started as the stop came, wrote no line
    scripted(grid(points=1, max_parallel=1), ["ok"] * 12, ["controller_pass", ("cancel_one", {"run": "lr=0.1"})], {10})


def test_a_run_whose_session_hung_up_with_its_host_ends_lost_and_cancelled_keeps_what_reached_the_store():
    """The ssh (and local) backend's own end: the run's tmux session goes with its host (SIGHUP, no stop file). The
    attempt ends lost, never stopped and never a failure (machine.hang_up asserts it); cancelled after, the run keeps
    what reached the store."""

    def then(m) -> None:  # (machine.hang_up asserted that attempt 1 ended lost; its next one counts it quick)
        status = read_status(m.store, "h", "lr=0.1")
        assert (status.attempt, status.failures, status.preemptions, status.quick_losses) == (2, 0, 1, 1), status
        m.cancel_one("lr=0.1")
        m.controller_pass()
        m.check_all()
        ended("cancelled", 2)(m)

    steps = [*PASS_AND_TICK * 2, ("hang_up", {"run": "lr=0.1"})]
    scripted(grid(points=1, max_parallel=1), ["ok"] * 12, steps, {10}, then)


def test_a_run_a_scheduler_took_back_and_then_cancelled_keeps_the_log_of_its_last_attempt():
    """Found by the random machine once the hang-up was one of its rules: a scheduler's SIGTERM (Slurm: a requeue, a
    preemption) ended attempt 1 interrupted, and `orch cancel` came before attempt 2 began, so attempt 1 is the run's
    last: its command's log (and what it wrote on the SIGTERM: its checkpoint) must be in the store. The agent kept
    nothing on a scheduler's stop; it keeps it now, as on orch's own stop."""

    def then(m) -> None:
        assert m.backend.take_back("lr=0.1") == [1]  # the job ends; `orch cancel` before the controller's next pass
        status = read_status(m.store, "h", "lr=0.1")
        assert (status.state, status.attempt) == ("interrupted", 1), status
        m.cancel_one("lr=0.1")
        m.check_all()
        ended("cancelled", 1)(m)

    scripted(grid(points=1, max_parallel=1), ["ok"] * 12, PASS_AND_TICK * 2, {10}, then)


def ended(state: str, attempt: int):
    """The one run of the scenario ended `state` on `attempt`."""

    def check(m) -> None:
        status = read_status(m.store, "h", "lr=0.1")
        assert (status.state, status.attempt) == (state, attempt), status

    return check


def test_a_host_its_dead_agent_left_up_after_the_end_is_released_and_a_cancel_keeps_the_record_succeeded():
    """The agent records the run's end and dies before its host goes (control/ended.py). `orch cancel` then stops the
    host and leaves the record as it ended (it once turned `succeeded` into `cancelled`: found by the random machine
    once that fault was among its rules); the loop's end releases the host."""

    def then(m) -> None:
        for _ in range(30):  # until the record says how it ended; its host is still up (nothing ended it)
            if read_status(m.store, "h", "lr=0.1").state == "succeeded":
                break
            m.controller_pass()
            m.agents_tick(1)
        assert [h.run_id for h in m.cloud.hosts.values()] == ["lr=0.1"]
        cancel_run(m.sweep, SimBackend(m.sweep, m.store, m.cloud, LINES), m.store, "lr=0.1")  # no pass after it
        ended("succeeded", 1)(m)
        m.check_all()
        m.loop_ends()  # (it checks that no host of an ended run is left)
        assert not m.cloud.hosts and m.controller is None

    steps = ["controller_pass", ("agents_tick", {"ticks": 1}), ("die_after_end", {"run": "lr=0.1"})]
    scripted(grid(points=1, max_parallel=1), ["ok"] * 12, steps, set(), then)


def test_a_node_that_fails_ends_the_attempt_with_every_nodes_log_and_the_run_folder_in_the_store():
    # node 1's command exits 7 while node 0's runs on: node 0 stops its command, syncs, and records the failure once
    # node 1 says its log is in the store (the check of the final run: both logs, every line, and node 0's metrics)
    scripted(
        grid(points=1, max_parallel=1, nodes=2),
        ["ok"] * 12,
        PASS_AND_TICK + [("fail_node", {"run": "lr=0.1"})] + PASS_AND_TICK * 4,
        checked={10},
        then=ended("failed", 1),
    )


def test_node_0_failing_ends_the_attempt_with_the_other_nodes_log_in_the_store():
    # node 0's command crashes while node 1's runs on: node 1 stops, syncs its log, and only then is the end recorded
    scripted(grid(points=1, max_parallel=1, nodes=2), ["crash"] * 12, PASS_AND_TICK * 6, {10}, ended("failed", 1))


def test_a_node_gone_ends_the_attempt_and_the_nodes_left_keep_what_they_wrote():
    # node 1's host vanishes: the controller calls the attempt lost and stops node 0 as orch stops a run (it syncs);
    # the run resumes and succeeds. Attempt 1's node 0 log and lines are in the store, checked here (the random
    # machine checks the final attempt).

    def first_attempt_kept(m) -> None:
        ended("succeeded", 2)(m)
        first = [r for r in m.cloud.received if r.attempt == 1 and r.node == 0]
        assert first and first[0].ended_by == StopReason.LOST, first  # stopped by orch, not gone with its host
        m._check_kept(first[0], read_status(m.store, "h", "lr=0.1"))

    scripted(
        grid(points=1, max_parallel=1, nodes=2),
        ["ok"] * 12,
        PASS_AND_TICK + [("vanish_node", {"run": "lr=0.1", "node": 1})] + PASS_AND_TICK * 8,
        {10},
        first_attempt_kept,
    )


def test_a_trial_whose_last_value_is_nan_is_told_fail():
    scripted(
        grid(search="random", points=1, max_parallel=1),
        ["nan_last"] * 12,
        PASS_AND_TICK * 8 + ["controller_pass"],
        checked={13},
    )


def test_each_ask_knows_every_trial_that_ended_before_it():
    scripted(
        grid(search="random", points=3, max_parallel=1),
        ["ok"] * 12,
        PASS_AND_TICK * 12,
        checked={9},
    )


def test_a_trial_cancelled_before_it_was_asked_is_told_before_the_next_ask():
    # found by the random machine: its run cancelled while queued, the trial was asked only with the next one
    scripted(grid(search="random", points=2, max_parallel=1), ["ok"] * 12, [("cancel_one", {"run": "trial=0"})], {9})


def test_a_search_space_naming_seed_is_refused_or_reaches_the_command_as_collect_shows(tmp_path):
    import yaml

    from orchestrator.backends.registry import load_sweep

    doc = grid(search="random", points=2, seeds=2).yaml()
    doc["search"]["space"]["seed"] = {"low": 1, "high": 1000, "int": True}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        load_sweep(path)
    except OrchError:
        return  # refused, as `params:` and `grid:` refuse it
    pytest.fail("a space with `seed` was accepted: both seeds of a trial run with one sampled seed")


def test_with_a_deadline_no_slot_can_meet_every_run_is_bought_on_demand():
    def all_on_demand(m) -> None:
        assert {i.market for i in m.cloud.instances.values()} == {"on-demand"}, m.cloud.instances
        assert {v.state for v in m.progress.runs} == {"succeeded"}

    steps = PASS_AND_TICK * 10 + ["controller_pass", "loop_ends"]
    scripted(grid(max_parallel=1, deadline="20s"), ["ok"] * 12, steps, checked=set(), then=all_on_demand)


def test_a_run_on_spot_that_a_reclaim_would_make_late_is_told_to_move_once_and_resumes_on_demand():
    # 90 s, a run assumed 60 s (its lines carry no clock), 5 s a move and as margin: spot at first; from 20 s on a
    # reclaim would make it late: it is told once, checkpoints, and its next attempt is bought on-demand
    m = Harness()
    try:
        m.setup(scenario=grid(points=1, max_parallel=1, deadline="90s"), kinds=["ok"] * 12)
        m.cloud.plans[("lr=0.1", 1)] = default_plan("lr=0.1", 1, 100)  # a line a second: longer than the steps below
        m.controller_pass()
        m.agents_tick(1)
        assert [i.market for i in m.cloud.instances.values()] == ["spot"]
        m.clock += 22  # (within its timeout: 60 s)
        m.cloud.now = m.clock
        m.controller_pass()
        assert [(r, a) for r, a, _ in m.cloud.moves] == [("lr=0.1", 1)], m.cloud.moves
        m.check_all()
        m.agents_tick(1)  # the agent sees the notice; the command checkpoints, as a trainer does on SIGUSR1
        [host] = m.cloud.hosts_of("lr=0.1")
        done = host.agent.agent.run_dir / CHECKPOINTS_DIR / "23"
        done.mkdir(parents=True)
        (done / MANIFEST_FILE).write_text("{}")
        for _ in range(10):
            m.controller_pass()
            m.agents_tick(1)
            m.check_all()
        status = read_status(m.store, "h", "lr=0.1")
        assert (status.state, status.attempt, status.failures) == ("succeeded", 2, 0), (status.reason, status)
        assert [i.market for i in m.cloud.instances.values()] == ["spot", "on-demand"]
    finally:
        m.teardown()
