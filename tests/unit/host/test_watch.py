"""The agent's watch as small periodic checks: each runs when due, does one job, and an error in it is
logged and tried again later. Each check is driven on a real agent (a folder store, real files, a
real child process) with the clock passed in, so nothing waits on the machine's speed."""

from __future__ import annotations

import logging
import signal
import subprocess
from dataclasses import replace

import pytest

from orchestrator.contract import RunTask
from orchestrator.host import watch
from orchestrator.host.agent import Agent
from orchestrator.host.attempt import pid_file
from orchestrator.store import layout
from orchestrator.store.folder import LocalStore
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import RunStatus, read_status, write_status
from orchestrator.wait import retry_until

NOW = 1_000_000.0


@pytest.fixture
def agent(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    task = RunTask(
        sweep="sw",
        run_id="r",
        attempt=1,
        command="true",
        store_url=str(tmp_path / "store"),
        run_dir=str(tmp_path / "host" / "run"),
        ctl_dir=str(tmp_path / "host" / "ctl"),
        session="orch_sw_r",
        node_hosts=2,
        sync_s=5.0,
    )
    a = Agent(task, store=store)
    a.ctl.mkdir(parents=True)
    a.run_dir.mkdir(parents=True)
    return a


class Counting(watch.Check):
    def __init__(self, agent, interval, first=0.0, fail=False):
        super().__init__(agent, interval, first)
        self.runs, self.fail = [], fail

    def run(self, now):
        self.runs.append(now)
        if self.fail:
            raise OSError("the store is away")


def test_a_check_runs_when_due_and_then_after_its_interval():
    c = Counting(None, 5.0, first=NOW + 1)
    for t in (NOW, NOW + 1, NOW + 2, NOW + 5.9, NOW + 6, NOW + 6.1):
        c.tick(t)
    assert c.runs == [NOW + 1, NOW + 6]


def test_a_check_that_raises_is_logged_and_tried_again_later(caplog):
    c = Counting(None, 0.0, fail=True)
    with caplog.at_level(logging.WARNING, logger="orch.agent"):
        assert c.tick(NOW) is False  # the watch goes on
    assert "Counting failed (OSError: the store is away); trying again later" in caplog.text
    c.tick(NOW + 1)  # held back: an error is not retried at every poll
    c.tick(NOW + watch.ERROR_RETRY_S)
    assert c.runs == [NOW, NOW + watch.ERROR_RETRY_S]


def test_the_command_exiting_ends_the_watch(agent):
    check = watch.CommandExited(agent)
    assert not check.tick(NOW)
    agent.exit_file.write_text("0\n")
    assert check.tick(NOW)


def test_the_deadline_asks_for_a_timeout_stop_and_a_first_reason_stands(agent):
    check = watch.Deadline(agent, NOW + 10)
    check.tick(NOW + 10)
    assert agent.stop_requested is None
    check.tick(NOW + 10.1)
    assert agent.stop_requested is StopReason.TIMEOUT
    watch.request_stop(agent, StopReason.SUPERSEDED)
    assert agent.stop_requested is StopReason.TIMEOUT


def test_a_record_taken_over_stops_the_command(agent):
    write_status(agent.store, "sw", RunStatus(run_id="r", state="starting", attempt=2))  # a newer claim
    assert not agent.reporter.record(RunStatus(run_id="r", state="running", attempt=1))
    watch.Superseded(agent).tick(NOW)
    assert agent.stop_requested is StopReason.SUPERSEDED
    assert read_status(agent.store, "sw", "r").attempt == 2  # nothing written over it


def test_a_failed_node_ends_the_attempt_on_node_0(agent):
    check = watch.NodeFailed(agent, 5.0)
    check.tick(NOW)
    assert agent.stop_requested is None
    agent.store.put_bytes(layout.node_exit_key("sw", "r", 1, 1), b"3\n")
    check.tick(NOW + 1)  # not due yet: looked at every notice_poll_s
    assert agent.stop_requested is None
    check.tick(NOW + 5)
    assert (agent.stop_requested, agent.node_failed) == (StopReason.NODE_FAILED, (1, 3))


def test_the_sync_puts_the_run_folder_in_the_store_every_sync_s(agent):
    (agent.run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    check = watch.SyncUp(agent, agent.task.sync_s, first=NOW + agent.task.sync_s)
    check.tick(NOW)
    assert agent.store.get_bytes(layout.metrics_key("sw", "r")) is None
    check.tick(NOW + 5)
    assert agent.store.get_bytes(layout.metrics_key("sw", "r")) == b'{"step": 1}\n'


def test_a_completed_checkpoint_goes_to_the_store_at_once_whatever_sync_s(agent):
    check = watch.CheckpointSync(agent, watch.CHECKPOINT_LOOK_S)
    step = agent.run_dir / "ckpt" / "20"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"x" * 100)
    check.tick(NOW)
    assert agent.store.get_bytes("sw/r/ckpt/20/state.pt") is None  # no manifest yet: not a checkpoint
    (step / "MANIFEST.json").write_text("{}")
    check.tick(NOW + 1)
    assert agent.store.get_bytes("sw/r/ckpt/20/MANIFEST.json") == b"{}"
    assert agent.store.get_bytes("sw/r/ckpt/20/state.pt") == b"x" * 100


def test_with_record_s_a_beat_rewrites_the_record_only_when_due_or_when_a_rung_or_state_moved(tmp_path):
    from orchestrator.host.reporter import Reporter
    from orchestrator.store import lifecycle as life

    store = LocalStore(str(tmp_path / "store"))
    write_status(store, "sw", RunStatus(run_id="r", state="starting", attempt=1))
    sign = tmp_path / "reported"
    rep = Reporter(store, "sw", "r", 1, tmp_path / "metrics.jsonl", reported=sign, record_s=60.0)
    status = read_status(store, "sw", "r")
    status = life.run(status, 1, "localhost", NOW)
    assert rep.record(status)
    version = sign.read_text()
    rep.beat(status, now=NOW + 1)
    rep.beat(status, now=NOW + 30)
    assert read_status(store, "sw", "r").heartbeat == NOW  # not rewritten: only the sign of life moved
    assert sign.stat().st_mtime == NOW + 30 and sign.read_text() == version
    status.at_rungs = {"2": 0.5}  # a rung reported: written at once
    rep.beat(status, now=NOW + 31)
    assert read_status(store, "sw", "r").heartbeat == NOW + 31 and sign.read_text() != version
    rep.beat(status, now=NOW + 95)
    assert read_status(store, "sw", "r").heartbeat == NOW + 95  # due again after record_s


def test_a_stop_is_sigterm_then_sigkill_after_the_grace(agent):
    # a command that ignores SIGTERM, in a session of its own (SIGKILL goes to its whole process group)
    ready = agent.ctl / "ready"
    cmd = subprocess.Popen(["bash", "-c", f"trap '' TERM; touch {ready}; sleep 60"], start_new_session=True)
    try:
        retry_until(ready.exists, 30, 0.05, "the command to ignore SIGTERM")
        (agent.ctl / pid_file("cmd", 1)).write_text(str(cmd.pid))
        check = watch.StopCommand(agent)
        assert not check.tick(NOW)  # nothing asked for
        watch.request_stop(agent, StopReason.CANCELLED)
        assert not check.tick(NOW) and agent.stop_sent_at == NOW
        assert cmd.poll() is None
        assert not check.tick(NOW + watch.KILL_GRACE_S)
        assert check.tick(NOW + watch.KILL_GRACE_S + 0.1)
        assert cmd.wait(timeout=10) == -signal.SIGKILL
    finally:
        if cmd.poll() is None:
            cmd.kill()


def test_the_watch_of_an_attempt_has_its_checks_in_order(agent):
    names = [c.name for c in watch.checks_for(agent, NOW)]
    assert names == [
        "CommandExited",
        "FindGroup",
        "WindowGone",
        "RungPassed",
        "Superseded",
        "NodeFailed",
        "SpotNotice",
        "Rebalance",
        "StopCommand",
        "CheckpointSync",
        "SyncUp",
    ]
    agent.task = replace(agent.task, timeout_s=30.0, node_hosts=1)
    names = [c.name for c in watch.checks_for(agent, NOW)]
    assert "Deadline" in names and "NodeFailed" not in names
