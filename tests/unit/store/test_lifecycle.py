"""A run's life as types: the states and stop reasons, the named transitions (which refuse a move a run
does not make), records written before the types, and no state set outside orchestrator/store/."""

from __future__ import annotations

import ast
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.store import lifecycle as life
from orchestrator.store.folder import LocalStore
from orchestrator.store.lifecycle import Ending, Impossible, RunState, StopReason
from orchestrator.store.status import RunStatus, read_status, status_key, write_status

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_000_000.0


def test_states_are_the_strings_records_hold():
    assert [s.value for s in RunState] == [
        "queued",
        "starting",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "interrupted",
        "lost",
        "stopped",
        "pruned",
        "corrupt",
    ]
    assert RunState.RUNNING == "running" and f"{RunState.LOST}" == "lost" and str(RunState.PRUNED) == "pruned"
    assert {"lost": 1}[RunState.LOST] == 1  # looked up by its string (styles, counts)
    assert json.dumps({"state": RunState.FAILED}) == '{"state": "failed"}'


@pytest.mark.parametrize(
    "reason, state, failure",
    [
        (StopReason.CANCELLED, RunState.CANCELLED, False),
        (StopReason.PRUNED, RunState.PRUNED, False),
        (StopReason.STOPPED, RunState.STOPPED, False),
        (StopReason.LOST, RunState.LOST, False),  # what backends/aws/pack.py sends when it frees a slot
        (StopReason.INTERRUPTED, RunState.INTERRUPTED, False),
        (StopReason.TIMEOUT, RunState.FAILED, True),
        (StopReason.SUPERSEDED, RunState.LOST, False),
        (StopReason.NODE_FAILED, RunState.FAILED, True),
    ],
)
def test_each_stop_reason_knows_the_state_it_ends_in(reason, state, failure):
    assert reason.to_state() is state and reason.failure is failure
    assert StopReason.parse(f"{reason.value}\n") is reason  # as the stop file carries it (echo adds a newline)


def test_an_unknown_stop_reason_is_an_error_naming_it():
    with pytest.raises(ValueError, match="unknown stop reason 'reboot'"):
        StopReason.parse("reboot\n")


def test_claim_starts_a_new_attempt_and_counts_a_preemption():
    lost = RunStatus(run_id="r", state="lost", attempt=2, failures=1, preemptions=1, first_started_at=5.0, host="h")
    new = life.claim(lost, now=NOW)
    assert (new.state, new.attempt, new.failures, new.preemptions) == (RunState.STARTING, 3, 1, 2)
    assert (new.started_at, new.first_started_at, new.host, new.finished_at) == (NOW, 5.0, "", None)
    assert life.claim(RunStatus(run_id="r"), now=NOW).preemptions == 0
    for final in ("succeeded", "cancelled", "pruned", "corrupt"):
        with pytest.raises(Impossible, match=f"cannot claim a new attempt of a run that is {final}"):
            life.claim(RunStatus(run_id="r", state=final))


def test_attempts_lost_soon_after_their_start_are_counted_in_a_row_and_end_the_run():
    """An agent or host that keeps dying (a crash at every attempt) is not the spot market: a cap, not a loop."""
    s = RunStatus(run_id="r")
    for n in range(life.MAX_QUICK_LOSSES):
        s = life.claim(s, now=NOW)
        assert s.quick_losses == n
        s = life.start(s, s.attempt, "h", "restoring", now=NOW + 1)  # its agent reported
        s = life.lose(s, "host lost", now=NOW + 185)  # (the verdict comes stale_s after the last sign of life)
    assert life.quick_loss(s) and life.claim(s, now=NOW + 186).quick_losses == life.MAX_QUICK_LOSSES
    s = life.give_up(s, "failed for good", now=NOW + 187)
    assert (s.state, s.failures, s.quick_losses) == (RunState.FAILED, 0, life.MAX_QUICK_LOSSES)
    assert s.finished_at == NOW + 187
    # a claim whose host never came or never reported is not one (no_shows counts those); active with its host
    # gone after a report is
    assert not life.quick_loss(life.claim(RunStatus(run_id="r"), now=NOW))
    gone = life.start(life.claim(RunStatus(run_id="r"), now=NOW), 1, "h", "restoring", now=NOW + 1)
    assert life.quick_loss(gone)
    # no capacity: the claim goes back to queued, and the count stands
    counted = RunStatus(run_id="r", state="lost", quick_losses=3, started_at=NOW, heartbeat=NOW + 5)
    requeued = life.requeue(life.claim(counted, now=NOW + 6), "no capacity")
    assert requeued.quick_losses == 4 and life.claim(requeued, now=NOW + 7).quick_losses == 4
    # a long attempt, a notice, or any other ending starts the count again
    long = RunStatus(run_id="r", state="lost", quick_losses=3, started_at=NOW, heartbeat=NOW + life.QUICK_LOSS_S)
    assert not life.quick_loss(long) and life.claim(long, now=NOW).quick_losses == 0
    noticed = RunStatus(run_id="r", state="interrupted", quick_losses=3, started_at=NOW, heartbeat=NOW + 1)
    assert life.claim(noticed, now=NOW + 2).quick_losses == 0
    with pytest.raises(Impossible):
        life.give_up(RunStatus(run_id="r", state=RunState.SUCCEEDED), "x")


def test_verdicts_set_state_reason_and_end_together():
    s = life.stop(RunStatus(run_id="r", state="starting", attempt=1), "stopped by orch down", now=NOW)
    assert (s.state, s.reason, s.finished_at) == (RunState.STOPPED, "stopped by orch down", NOW)
    s = life.lose(RunStatus(run_id="r", state="running", attempt=1), "host gone", now=NOW)
    assert (s.state, s.reason, s.finished_at) == (RunState.LOST, "host gone", NOW)
    s = life.fail(RunStatus(run_id="r", state="starting", attempt=1), "no image", now=NOW)
    assert (s.state, s.failures, s.finished_at) == (RunState.FAILED, 1, NOW)
    assert life.fail(RunStatus(run_id="r", state="starting"), "never reported", failure=False).failures == 0
    s = life.requeue(RunStatus(run_id="r", state="starting", attempt=3), "no capacity")
    assert (s.state, s.attempt, s.reason) == (RunState.QUEUED, 2, "no capacity")
    s = life.prune(RunStatus(run_id="r", state="running"), "below the cutoff", {"rung": 1}, now=NOW)
    assert (s.state, s.pruned, s.finished_at) == (RunState.PRUNED, {"rung": 1}, NOW)
    s = life.cancel(RunStatus(run_id="r", state="queued"), "budget reached", now=NOW)
    assert (s.state, s.finished_at) == (RunState.CANCELLED, NOW)


@pytest.mark.parametrize(
    "move, state",
    [
        (lambda s: life.stop(s, "x"), "queued"),  # orch down stops claims, never a run that waits
        (lambda s: life.lose(s, "x"), "succeeded"),
        (lambda s: life.requeue(s, "x"), "failed"),
        (lambda s: life.prune(s, "x", {}), "succeeded"),
        (lambda s: life.cancel(s, "x"), "cancelled"),
        (lambda s: life.run(s, 1, "h"), "running"),
        (lambda s: life.interrupt(s, "x"), "queued"),
        (lambda s: life.finish(s, Ending(RunState.SUCCEEDED, "", False), 0, ""), "succeeded"),
        (lambda s: life.start(s, 1, "h", "restoring"), "pruned"),
    ],
)
def test_an_impossible_move_is_refused_and_changes_nothing(move, state):
    status = RunStatus(run_id="r", state=state, reason="before")
    with pytest.raises(Impossible):
        move(status)
    assert (status.state, status.reason, status.finished_at) == (RunState(state), "before", None)


def test_the_agents_moves_through_an_attempt():
    s = life.start(RunStatus(run_id="r", state="starting", attempt=2, no_shows=2), 2, "h", "restoring", now=NOW)
    assert (s.state, s.host, s.no_shows, s.heartbeat, s.reason) == (RunState.STARTING, "h", 0, NOW, "restoring")
    s.exit_code, s.log_tail = 3, "old"
    s = life.run(s, 2, "h", now=NOW + 1)
    assert (s.state, s.started_at, s.exit_code, s.log_tail, s.reason) == (RunState.RUNNING, NOW + 1, None, "", "")
    s = life.interrupt(s, "spot interruption notice; checkpoint step 4", now=NOW + 2)
    s = life.finish(s, Ending(RunState.INTERRUPTED, "", False), 143, "tail", now=NOW + 3)
    assert (s.state, s.reason, s.finished_at, s.exit_code) == (
        RunState.INTERRUPTED,
        "spot interruption notice; checkpoint step 4",
        NOW + 3,
        143,
    )
    failed = life.finish(RunStatus(run_id="r", state="running"), Ending(RunState.FAILED, "exit code 3", True), 3, "")
    assert (failed.state, failed.failures) == (RunState.FAILED, 1)


def test_a_record_written_before_the_types_reads_and_writes_back_what_it_held(tmp_path):
    saved = ROOT / "tests" / "records" / "status-interrupted-plain-strings.json"
    store = LocalStore(str(tmp_path / "store"))
    key = status_key("sw", "lr=0.1,seed=0")
    store.put_bytes(key, saved.read_bytes())
    status = read_status(store, "sw", "lr=0.1,seed=0")
    assert status.state is RunState.INTERRUPTED and status.last_metrics["test_acc"] == 0.61
    assert life.claim(status).preemptions == 2
    write_status(store, "sw", status)
    back, before = json.loads(store.get_bytes(key)), json.loads(saved.read_bytes())
    assert {k: back[k] for k in before} == before  # every field it held, unchanged
    fresh = asdict(RunStatus(run_id=status.run_id))
    assert {k: v for k, v in back.items() if k not in before} == {k: fresh[k] for k in back if k not in before}


def _state_writes(path: Path):
    """(line, what) for each assignment to a `.state` and each RunStatus(..., state=...) in a file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in _assigned(targets):
            if isinstance(t, ast.Attribute) and t.attr == "state" and not _is_self(t.value):
                yield t.lineno, ast.unparse(t)
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in ("RunStatus", "replace"):
            if any(k.arg == "state" for k in node.keywords):
                yield node.lineno, ast.unparse(node.func) + "(state=...)"


def _assigned(targets):
    """The names and attributes assigned to, through tuples (not what a subscript's index reads)."""
    for t in targets:
        if isinstance(t, (ast.Tuple, ast.List)):
            yield from _assigned(t.elts)
        elif isinstance(t, ast.Starred):
            yield from _assigned([t.value])
        else:
            yield t


def _is_self(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id == "self"  # an object's own `state` attribute (a State cache)


def test_no_run_state_is_set_outside_the_store():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted((ROOT / "orchestrator").rglob("*.py"))
        if "store" not in path.relative_to(ROOT / "orchestrator").parts[:1]
        for line, what in _state_writes(path)
    ]
    assert not found, "set a run's state through orchestrator/store/lifecycle.py's transitions:\n" + "\n".join(found)


def test_the_state_check_finds_an_assignment(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(status, view, counts):\n"
        "    status.state, status.reason = 'failed', 'x'\n"
        "    view.state = 'lost'\n"
        "    counts[view.state] = 1\n"  # reads a state: fine
        "    RunStatus(run_id='r', state='lost')\n"
    )
    assert [line for line, _ in _state_writes(bad)] == [2, 3, 5]


def test_the_agent_reads_the_stop_files_reason_and_names_an_unknown_one(tmp_path, caplog):
    from orchestrator.host.notices import stop_reason

    stop_file = tmp_path / "stop-reason"
    assert stop_reason(stop_file) is StopReason.STOPPED  # a SIGTERM without a stop file: someone ended the agent
    assert stop_reason(stop_file, hangup=True) is StopReason.LOST  # its session killed: its host is gone
    assert stop_reason(stop_file, scheduled=True) is StopReason.INTERRUPTED  # a scheduler took the job back
    stop_file.write_text("pruned\n")
    assert stop_reason(stop_file) is StopReason.PRUNED
    stop_file.write_text("reboot\n")
    with caplog.at_level("ERROR", logger="orch.agent"):
        assert stop_reason(stop_file) is StopReason.STOPPED
    assert "unknown stop reason 'reboot'" in caplog.text


def test_a_host_released_by_the_controller_ends_the_attempt_as_lost_not_failed():
    from orchestrator.host.attempt import final_status

    assert final_status(StopReason.LOST, False, 143, None) == Ending(RunState.LOST, StopReason.LOST.words(), False)


def test_an_agent_cannot_start_a_run_that_ended_for_good():
    """A host that booted after its run was cancelled (or pruned, or ended) must not bring the run back."""
    for final in ("succeeded", "cancelled", "pruned", "corrupt"):
        with pytest.raises(Impossible, match=f"cannot start a run that is {final}"):
            life.start(RunStatus(run_id="r", state=final, attempt=1), 1, "h", "restoring", now=NOW)


def test_an_unreadable_record_is_recovered_as_its_newest_logged_attempt_lost():
    corrupt = RunStatus(run_id="r", state="corrupt", reason="status record x is not JSON")
    lost = life.recover(corrupt, 3)
    assert (lost.state, lost.attempt, lost.reason) == (RunState.LOST, 3, "status record x is not JSON")
    assert life.claim(lost, now=NOW).attempt == 4
    with pytest.raises(Impossible, match="cannot recover a run that is running"):
        life.recover(RunStatus(run_id="r", state="running"), 3)


def test_a_transition_gives_a_new_record_and_leaves_the_one_it_was_given():
    """So a writer whose conditional write is refused (the controller's cache) still holds what the store has."""
    running = RunStatus(run_id="r", state="running", attempt=1, started_at=NOW, heartbeat=NOW)
    before = asdict(running)
    moved = [
        life.prune(running, "below the cutoff", {"rung": 1}, now=NOW),
        life.cancel(running, "cancelled", now=NOW),
        life.lose(running, "host gone", now=NOW),
        life.fail(running, "no image", now=NOW),
        life.stop(running, "stopped", now=NOW),
        life.interrupt(running, "notice", now=NOW),
        life.finish(running, Ending(RunState.SUCCEEDED, "", False), 0, "", now=NOW),
        life.give_up(running, "failed for good", now=NOW),
        life.requeue(running, "no capacity"),
    ]
    assert asdict(running) == before and all(m is not running and m.state != RunState.RUNNING for m in moved)
