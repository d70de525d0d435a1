"""One writer per record: conditional writes in both stores, the agent's reporter that stops writing
once the controller moved on, and a controller that never claims over a record it did not read (boto3 pinned where
S3's conditional puts exist); the recorded sweep, which a changed sweep file may not overwrite."""

from __future__ import annotations

import builtins
import json
import threading
import time
from pathlib import Path

import pytest

from orchestrator.backends.base import BackendBase, Host
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import RunTask
from orchestrator.control.controller import Controller
from orchestrator.control.state import State
from orchestrator.host.reporter import Reporter
from orchestrator.store import lifecycle as life
from orchestrator.store.folder import LocalStore
from orchestrator.store.lifecycle import Ending
from orchestrator.store.status import (
    LOST,
    RUNNING,
    SUCCEEDED,
    RunStatus,
    read_status,
    update_status,
    write_status,
)
from orchestrator.sweep.record import SWEEP_SCHEMA
from tests.conftest import finish


def test_put_if_refuses_a_write_over_what_the_writer_did_not_read(store):
    assert store.put_if("k", b"one", None)  # new key
    assert not store.put_if("k", b"two", None)  # "only if absent", and it is there
    data, v1 = store.get_versioned("k")
    assert data == b"one" and v1
    assert store.put_if("k", b"two", v1)
    assert not store.put_if("k", b"three", v1)  # v1 is stale now
    assert store.get_bytes("k") == b"two"
    assert store.get_versioned("missing") == (None, None)


def test_concurrent_updates_lose_nothing(store):
    """Several writers read-modify-write one record; every change survives (no lost update)."""
    write_status(store, "sw", RunStatus(run_id="r"))

    def bump(status):
        status.failures += 1
        return status

    def writer():
        for _ in range(5):
            update_status(store, "sw", "r", bump)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert read_status(store, "sw", "r").failures == 20


def test_the_reporter_stops_writing_once_the_controller_moved_on(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    write_status(store, "sw", RunStatus(run_id="r", state="starting", attempt=1))  # the controller's claim
    mine = RunStatus(run_id="r", state=RUNNING, attempt=1, heartbeat=time.time())
    reporter = Reporter(store, "sw", "r", 1, tmp_path / "metrics.jsonl")
    assert reporter.record(mine) and read_status(store, "sw", "r").state == RUNNING

    # the controller calls the host lost (same attempt): the agent's next write must not undo that
    lost = read_status(store, "sw", "r")
    lost.state = LOST
    write_status(store, "sw", lost)
    assert not reporter.record(mine) and reporter.superseded
    assert read_status(store, "sw", "r").state == LOST

    # and a newer attempt's record is never touched by an older attempt's reporter
    write_status(store, "sw", RunStatus(run_id="r", state="starting", attempt=2))
    assert not Reporter(store, "sw", "r", 1, tmp_path / "m").record(mine)
    assert read_status(store, "sw", "r").attempt == 2


class WakingAgent(BackendBase):
    """A backend whose agent writes its record between the controller's read and its write (an agent
    that was silent long enough to be called lost, and woke up just then)."""

    name = "test"

    def __init__(self, store, tmp: Path):
        self.store, self.tmp = store, tmp
        self.started: list[RunTask] = []

    def list(self) -> builtins.list[Host]:
        return [Host(run_id="run", host_id="h1", address="localhost", attempt=1)]

    def spend(self) -> float:  # called after the controller read the records
        status = read_status(self.store, "rec", "run")
        status.state, status.heartbeat = RUNNING, time.time()
        write_status(self.store, "rec", status)
        return 0.0

    def new_task(self, run_id, attempt, command, params_json, replaces="") -> RunTask:
        return RunTask(
            sweep="rec",
            run_id=run_id,
            attempt=attempt,
            command=command,
            store_url=self.store.url,
            run_dir=str(self.tmp / "run"),
            ctl_dir=str(self.tmp / "ctl"),
            session="s",
        )

    def start(self, task: RunTask) -> Host:
        self.started.append(task)
        return Host(run_id=task.run_id, host_id="h2", address="localhost", attempt=task.attempt)

    def release(self, host: Host) -> None:
        pass


def test_the_controller_never_claims_over_a_record_that_changed_since_it_read_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text("name: rec\ncommand: 'true'\nstore: store\n")
    sweep = load_sweep(path)
    store = LocalStore(str(tmp_path / "store"))
    # attempt 1's agent has been silent for 10 minutes: the controller's pass will want to replace it
    write_status(
        store,
        "rec",
        RunStatus(run_id="run", state=RUNNING, attempt=1, started_at=time.time() - 900, heartbeat=time.time() - 600),
    )
    backend = WakingAgent(store, tmp_path)
    controller = Controller(sweep, backend, store, State(tmp_path / "home"))
    controller.prepare()
    controller.step()
    after = read_status(store, "rec", "run")
    assert (after.state, after.attempt) == (RUNNING, 1), after  # the woken agent's record stands
    controller.step()  # and the next pass, seeing it alive, leaves it alone
    assert backend.started == [] and read_status(store, "rec", "run").attempt == 1


def test_a_writer_stuck_holding_a_records_lock_does_not_block_the_others(tmp_path, monkeypatch):
    """An agent stopped (SIGSTOP) or stalled while it holds the folder lock of its record must not hang the
    controller: the lock is held for a compare and a rename only, and one not had in time counts as a change."""
    import fcntl
    import os

    from orchestrator.store import folder

    store = folder.LocalStore(str(tmp_path / "store"))
    key = "sw/.orch/r/status.json"
    assert store.put_if(key, b"one", None)
    version = store.get_versioned(key)[1]
    holder = os.open(tmp_path / "store" / "sw" / ".orch" / "r", os.O_RDONLY)  # another open file: flock conflicts
    fcntl.flock(holder, fcntl.LOCK_EX)
    monkeypatch.setattr(folder, "LOCK_WAIT_S", 0.3)
    try:
        assert store.put_if(key, b"two", version) is None  # refused, not blocked
        assert store.get_bytes(key) == b"one" and not list((tmp_path / "store" / "sw" / ".orch" / "r").glob("*.tmp"))
    finally:
        os.close(holder)
    assert store.put_if(key, b"two", version) and store.get_bytes(key) == b"two"


class CancelMidPass(WakingAgent):
    """`orch cancel` lands between the pass's read of the record and its claim (spend() is called after
    the records are read, before anything starts)."""

    def list(self) -> builtins.list[Host]:
        return []

    def spend(self) -> float:
        def cancel(status: RunStatus) -> RunStatus:
            status.state, status.reason = "cancelled", "cancelled by orch cancel"
            return status

        update_status(self.store, "rec", "run", cancel)
        return 0.0


def test_a_claim_is_conditional_on_the_record_the_decision_was_made_from(tmp_path, monkeypatch):
    """An interrupted run is due for attempt 2; a cancel written after the pass read it must win: no
    second attempt, no host paid for."""
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text("name: rec\ncommand: 'true'\nstore: store\n")
    sweep = load_sweep(path)
    store = LocalStore(str(tmp_path / "store"))
    write_status(store, "rec", RunStatus(run_id="run", state="interrupted", attempt=1, started_at=time.time() - 60))
    backend = CancelMidPass(store, tmp_path)
    controller = Controller(sweep, backend, store, State(tmp_path / "home"))
    controller.prepare()
    controller.step()
    after = read_status(store, "rec", "run")
    assert (after.state, after.attempt) == ("cancelled", 1) and backend.started == [], after
    controller.step()
    assert backend.started == [] and read_status(store, "rec", "run").state == "cancelled"


def test_status_right_after_cancel_of_a_queued_run_shows_it_cancelled(orch, tmp_path, monkeypatch):
    """No controller pass after the cancel (none runs): the summary still says queued; status must not."""
    from orchestrator.control import summary
    from orchestrator.control.views import Progress, RunView

    path = orch.sweep("name: later\ncommand: 'true'\nstore: store\ngrid:\n  x: [1, 2]\n")
    sweep = load_sweep(path)
    store = LocalStore(str(orch.store()))
    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    Controller(sweep, WakingAgent(store, tmp_path), store, State(orch.home)).prepare()
    rows = [
        RunView(run_id=r.run_id, state="queued", attempt=0, failures=0, preemptions=0, elapsed=None, metrics={})
        for r in sweep.runs
    ]
    summary.write(store, Progress(sweep="later", runs=rows))
    r = orch("cancel", "later/x=2")
    assert r.code == 0, r.err
    states = {v["run_id"]: v["state"] for v in json.loads(orch("status", "later", "--json").out)["runs"]}
    assert states == {"x=1": "queued", "x=2": "cancelled"}, states
    assert "cancelled" in orch("status", "later").out


# --- sweep records written by earlier orch versions (tests/records/sweeps, made by tests/records/make_sweep_records.py)


SWEEP_RECORDS = Path(__file__).parents[2] / "records" / "sweeps"
# Before 2026-11-30 (fa0a8f3) a run's records lay in its own folder, not under .orch/: today's orch cannot read them.
OLD_LAYOUT = "2026-11-29-05e919f"


def _recorded(orch, version: str) -> Path:
    """An earlier orch's sweep as it left it (x=1 succeeded, x=2 running when it was killed), placed in this test's
    folder, with the file x=2 waits for already there."""
    source = SWEEP_RECORDS / version
    for path in source.rglob("*"):
        if path.is_file() and path.name != "ORCH_VERSION":
            dest = orch.tmp / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(path.read_text().replace("@ROOT@", str(orch.tmp)))
    orch.home.mkdir(parents=True, exist_ok=True)
    (orch.home / "release").touch()
    return orch.tmp / "sweep.yaml"


@pytest.mark.parametrize("version", sorted(p.name for p in SWEEP_RECORDS.iterdir() if p.name != OLD_LAYOUT))
def test_a_sweep_recorded_by_an_earlier_orch_continues_after_an_upgrade(orch, version):
    r = orch("launch", str(_recorded(orch, version)))
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert (orch.home / "ran").read_text().split() == ["2"], "x=1 had succeeded: it must not run again"
    store = LocalStore(str(orch.tmp / "store"))
    one, two = read_status(store, "upgraded", "x=1"), read_status(store, "upgraded", "x=2")
    assert (one.state, one.attempt) == ("succeeded", 1)
    assert two.state == "succeeded" and two.attempt >= 2, two


def test_a_sweep_recorded_before_run_records_moved_under_orch_is_refused_not_rerun(orch):
    r = orch("launch", str(_recorded(orch, OLD_LAYOUT)))
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert "2026-11-30" in r.err and "new `name:`" in r.err, r.err
    assert not (orch.home / "ran").exists()


def test_a_sweep_recorded_by_a_newer_orch_is_refused_with_the_upgrade_to_make(orch):
    newest = sorted(p.name for p in SWEEP_RECORDS.iterdir())[-1]
    path = _recorded(orch, newest)
    key = orch.tmp / "store" / "upgraded" / "sweep.json"
    record = json.loads(key.read_text())
    record["schema"] = SWEEP_SCHEMA + 1
    key.write_text(json.dumps(record))
    for args in (["--dry-run"], []):
        r = orch("launch", str(path), *args)
        assert r.code == 2 and "Traceback" not in r.err, r.err
        assert f"schema {SWEEP_SCHEMA + 1}" in r.err and "Upgrade orch" in r.err, r.err
    assert not (orch.home / "ran").exists()


def _strip_defaults(recorded: dict, model) -> dict:
    """The record as an orch that did not know its default-valued fields yet would have written it."""
    out = {}
    for key, value in recorded.items():
        info = model.model_fields.get(key)
        nested = getattr(info.annotation, "model_fields", None) if info else None
        if isinstance(value, dict) and nested is not None:
            out[key] = _strip_defaults(value, info.annotation)
        elif info is None or value != info.get_default(call_default_factory=True):
            out[key] = value
    return out


def test_fields_an_older_orch_did_not_record_are_read_at_their_defaults_and_free_ones_may_change(orch):
    """Every field at its default left out of the record (what a field added later looks like in an older record),
    and the file changes how many run at once and its description: the sweep continues."""
    from orchestrator.sweep.spec import SweepSpec

    path = _recorded(orch, sorted(p.name for p in SWEEP_RECORDS.iterdir())[-1])
    key = orch.tmp / "store" / "upgraded" / "sweep.json"
    record = json.loads(key.read_text())
    record["spec"] = _strip_defaults(record["spec"], SweepSpec)
    assert "max_runs" not in record["spec"] and "local" in record["spec"], record["spec"]
    key.write_text(json.dumps(record))
    path.write_text(path.read_text().replace("max_parallel: 2", "max_parallel: 1\ndescription: after the upgrade"))
    r = orch("launch", str(path))
    assert r.code == 0, r.err
    assert (orch.home / "ran").read_text().split() == ["2"]
    spec = json.loads(key.read_text())["spec"]
    assert (spec["max_parallel"], spec["description"]) == (1, "after the upgrade")  # status by name shows the file's


def test_a_relaunch_may_change_every_free_field_and_the_record_takes_the_files_values(orch):
    """FREE fields (description, max_parallel, max_runs, workdir_max_mb) change nothing a run gets: a relaunch that
    edits each of them continues the sweep (not refused as a changed sweep) and the record says what the file says."""
    path = _recorded(orch, sorted(p.name for p in SWEEP_RECORDS.iterdir())[-1])
    key = orch.tmp / "store" / "upgraded" / "sweep.json"
    edits = "max_parallel: 1\ndescription: edited\nmax_runs: 7\nworkdir_max_mb: 3"
    path.write_text(path.read_text().replace("max_parallel: 2", edits))
    r = orch("launch", str(path))
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert (orch.home / "ran").read_text().split() == ["2"], "x=1 had succeeded: it must not run again"
    spec = json.loads(key.read_text())["spec"]
    got = {k: spec.get(k) for k in ("max_parallel", "description", "max_runs", "workdir_max_mb")}
    assert got == {"max_parallel": 1, "description": "edited", "max_runs": 7, "workdir_max_mb": 3}, got


def test_boto3_is_pinned_where_conditional_puts_exist():
    """PutObject's IfMatch (orch's conditional status writes) first appears in botocore 1.35.69; an older
    install raises ParamValidationError, uncaught, on the first claim."""
    import re

    import botocore.session

    from tests.conftest import ROOT

    pinned = re.search(r'"boto3>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert tuple(int(x) for x in pinned.split(".")) >= (1, 35, 69)
    model = botocore.session.get_session().get_service_model("s3").operation_model("PutObject").input_shape
    assert "IfMatch" in model.members and "IfNoneMatch" in model.members


@pytest.mark.slow
def test_dry_run_refuses_a_changed_sweep_like_launch(orch):
    path = orch.sweep("name: chg\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    path.write_text("name: chg\ncommand: 'echo changed'\nstore: store\n")
    dry, real = orch("launch", str(path), "--dry-run"), orch("launch", str(path))
    assert dry.code == real.code != 0 and "different sweep" in dry.err and "different sweep" in real.err, (
        dry.err,
        real.err,
    )


class FinishesMidPass(WakingAgent):
    """No host is listed; the run's agent writes its final record after the pass read the records (spend() comes
    between the reads and the pass's writes): every verdict or claim this pass makes on it is refused by the store."""

    def list(self) -> builtins.list[Host]:
        return []

    def spend(self) -> float:
        def succeed(status: RunStatus) -> RunStatus | None:
            return life.finish(status, Ending(SUCCEEDED, "", False), 0, "") if status.state == RUNNING else None

        update_status(self.store, "rec", "x=1", succeed)
        return 0.0


def test_a_refused_verdict_leaves_the_controllers_cache_as_the_store_had_it(tmp_path, monkeypatch):
    """x=1's value at the rung is under the cutoff: the pass prunes it, then (its host gone) claims a new attempt.
    Its agent wrote first, so the store refuses both; the record cached for the run must stay the one read, not the
    verdict that was never written (a claim from an unwritten `pruned` is a crash), and the next pass reads what the
    agent wrote."""
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "name: rec\ncommand: 'true'\nstore: store\ngrid:\n  x: [9, 1]\n"
        "prune: {metric: acc, rungs: [1], keep: 0.5, min_runs: 2}\n"
    )
    sweep = load_sweep(path)
    store = LocalStore(str(tmp_path / "store"))
    now = time.time()
    for rid, state, acc in (("x=9", SUCCEEDED, 0.9), ("x=1", RUNNING, 0.1)):
        write_status(
            store,
            "rec",
            RunStatus(
                run_id=rid,
                state=state,
                attempt=1,
                started_at=now - 60,
                heartbeat=now,
                last_metrics={"epoch": 1, "acc": acc},
                at_rungs={"1": acc},
                metric_seen=True,
            ),
        )
    read = read_status(store, "rec", "x=1")
    backend = FinishesMidPass(store, tmp_path)
    controller = Controller(sweep, backend, store, State(tmp_path / "home"))
    controller.prepare()
    controller.step()
    assert controller.table.status["x=1"] == read  # the record as read, at the version the cache holds with it
    assert read_status(store, "rec", "x=1").state == SUCCEEDED and backend.started == []
    progress = controller.step()
    assert {v.run_id: v.state for v in progress.runs} == {"x=9": SUCCEEDED, "x=1": SUCCEEDED} and progress.done
