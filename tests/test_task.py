"""A run's task is built whole on the controller's side and written one way; what only the host knows
(its paths with `~` expanded, the shape's GPUs and port) is kept beside it, never written into it."""

from __future__ import annotations

import os
from dataclasses import asdict

from orchestrator.contract import RunTask, task_file
from orchestrator.host.env import HostFacts


def _task(**kw) -> RunTask:
    base = dict(
        sweep="sw",
        run_id="lr=0.1",
        attempt=2,
        command="python -m trainer",
        store_url="s3://b/p",
        run_dir="~/orch/runs/sw/lr=0.1/run",
        ctl_dir="~/orch/runs/sw/lr=0.1/ctl",
        session="orch_sw_lr=0_1",
        env={"ORCH_RUN_DIR": "~/orch/runs/sw/lr=0.1/run", "ORCH_DATA_DIR": "~/data/x", "ORCH_NODES": "2"},
        data=[{"from": "s3://b/data/", "to": "~/data/x"}],
    )
    return RunTask(**{**base, **kw})


def test_a_task_reads_back_as_it_was_written(tmp_path):
    task = _task(rungs_at="epoch", rungs=[1.0, 3.0], replaces="i-0abc")
    assert RunTask.from_json(task.to_json()) == task
    path = tmp_path / "ctl" / "task-2.json"
    task.save(path)
    assert RunTask.load(path) == task and path.stat().st_mode & 0o777 == 0o600
    assert task_file("~/x/ctl/", 2) == "~/x/ctl/task-2.json"


def test_each_node_gets_its_rank_and_host_and_the_rest_is_the_same_task():
    task = _task()
    node = task.on_node(1, "i-1", 2)
    assert (node.node_rank, node.host, node.node_hosts, node.env["ORCH_NODE_RANK"]) == (1, "i-1", 2, "1")
    assert "ORCH_NODE_RANK" not in task.env and task.node_rank == 0
    assert {k: v for k, v in asdict(node).items() if k not in ("env", "host", "node_rank", "node_hosts")} == {
        k: v for k, v in asdict(task).items() if k not in ("env", "host", "node_rank", "node_hosts")
    }


def test_the_hosts_facts_expand_its_paths_and_leave_the_task_as_it_came():
    task = _task()
    before = asdict(task)
    here = HostFacts.of(task)
    home = os.path.expanduser("~")
    assert str(here.run_dir) == f"{home}/orch/runs/sw/lr=0.1/run" and str(here.ctl_dir).startswith(home + "/")
    assert here.data == [{"from": "s3://b/data/", "to": f"{home}/data/x"}]
    env = here.command_env(task)
    assert env["ORCH_RUN_DIR"] == str(here.run_dir) and env["ORCH_DATA_DIR"] == f"{home}/data/x"
    assert int(env["ORCH_MASTER_PORT"]) > 0  # a multi-node shape: the port is the host's to pick
    assert asdict(task) == before
