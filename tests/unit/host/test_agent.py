"""The agent (host/agent.py) and its reporter (host/reporter.py) on a real folder store: what it may write over.

The record of a running attempt is the agent's; a verdict someone else wrote on it (the controller's lost, a
prune; `orch cancel`; `orch down` on a claim whose host was still booting) stands, and the agent writes nothing
more. Each second writer here really writes the store, between the agent's read and its write. And the final
status of an attempt (`final_status`, a pure function) from its stop, its notice and its exit code."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from orchestrator.contract import RunTask
from orchestrator.host.agent import Agent
from orchestrator.host.reporter import Reporter
from orchestrator.store import lifecycle as life
from orchestrator.store.folder import LocalStore
from orchestrator.store.status import read_status, update_status, write_status

NOW = 1_000_000.0


def _claimed(store: LocalStore) -> None:
    write_status(store, "sw", life.claim(life.RunStatus(run_id="r"), now=NOW))


VERDICTS = {
    "cancelled": lambda s: life.cancel(s, "cancelled by orch cancel"),
    "stopped": lambda s: life.stop(s, "stopped by orch down"),
    "lost": lambda s: life.lose(s, "host lost"),
    "pruned": lambda s: life.prune(s, "pruned at epoch 1", {"rung": 1}),
    "failed": lambda s: life.fail(s, "provisioning failed"),
}


def test_an_agent_whose_run_was_cancelled_while_its_host_booted_writes_nothing_and_runs_nothing(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    _claimed(store)
    update_status(store, "sw", "r", VERDICTS["cancelled"])  # orch cancel, before the agent began
    before = asdict(read_status(store, "sw", "r"))
    mark = tmp_path / "ran"
    task = RunTask(
        sweep="sw",
        run_id="r",
        attempt=1,
        command=f"touch {mark}",
        store_url=str(tmp_path / "store"),
        run_dir=str(tmp_path / "host" / "run"),
        ctl_dir=str(tmp_path / "host" / "ctl"),
        session="orch_sw_r",
    )
    assert Agent(task, store=store).run() == 0
    assert asdict(read_status(store, "sw", "r")) == before and not mark.exists()


@pytest.mark.parametrize("verdict", sorted(VERDICTS))
def test_a_verdict_written_between_the_agents_read_and_its_first_write_stands(tmp_path, verdict):
    store = LocalStore(str(tmp_path / "store"))
    _claimed(store)
    reporter = Reporter(store, "sw", "r", 1, tmp_path / "metrics.jsonl")
    status = life.start(read_status(store, "sw", "r"), 1, "h", "restoring the run folder", now=NOW + 1)
    update_status(store, "sw", "r", VERDICTS[verdict])  # the second writer, after the agent's read
    assert reporter.record(status) is False and reporter.superseded
    assert read_status(store, "sw", "r").state == verdict


@pytest.mark.slow
@pytest.mark.parametrize(
    "stop, noticed, code, want",
    [
        (None, False, 0, ("succeeded", False)),
        (None, False, 3, ("failed", True)),
        (None, False, None, ("failed", True)),  # the command vanished
        (None, True, 138, ("interrupted", False)),  # a notice killed a command without a SIGUSR1 handler
        ("interrupted", False, 143, ("interrupted", False)),
        ("timeout", False, 143, ("failed", True)),
        ("timeout", True, 143, ("failed", True)),  # the limit came first
        ("cancelled", False, 143, ("cancelled", False)),
        ("stopped", False, 143, ("stopped", False)),
        (
            "superseded",
            True,
            0,
            ("lost", False),
        ),  # the controller called it lost: whatever the exit, not ours to record
    ],
)
def test_final_status(stop, noticed, code, want):
    from orchestrator.host.agent import final_status

    state, reason, failed = final_status(stop, noticed, code, 3.0)
    assert (state, failed) == want
    if stop == "timeout":
        assert reason == "timed out after 3 s"


@pytest.mark.parametrize(
    "reason, orchs_file, scheduler_sigterm, kept",
    [
        ("stopped", True, False, True),  # orch down
        ("cancelled", True, False, True),
        ("pruned", True, False, True),
        ("lost", True, False, True),  # the controller stops the nodes left of an attempt a node of which went
        ("stopped", False, False, False),  # someone's SIGTERM: another attempt may have begun
        ("lost", False, False, False),  # a SIGHUP: the session went with its host
        ("interrupted", False, True, True),  # a scheduler took the job back: what the command wrote on it is kept
        ("interrupted", False, False, False),
        ("interrupted", True, False, False),  # a spot notice is not a stop that keeps (the notice path syncs)
    ],
)
def test_which_stops_keep_what_the_command_wrote(reason, orchs_file, scheduler_sigterm, kept):
    from orchestrator.host.notices import kept_stop
    from orchestrator.store.lifecycle import StopReason

    assert kept_stop(StopReason(reason), orchs_file, scheduler_sigterm) is kept
