"""A run's task is built whole on the controller's side and written one way; what only the host knows
(its paths with `~` expanded, the shape's GPUs and port) is kept beside it, never written into it."""

from __future__ import annotations

import ast
import os
from dataclasses import FrozenInstanceError, asdict
from pathlib import Path

import pytest

from orchestrator.contract import RunTask, task_file
from orchestrator.host.env import HostFacts
from orchestrator.sweep.tasks import on_host


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
    node = on_host(task, "i-1", 1, 2, {"ORCH_PYTHON": "/opt/py", "ORCH_NODES": "4"}, slot=1)
    assert (node.node_rank, node.host, node.node_hosts, node.slot) == (1, "i-1", 2, 1)
    assert node.env == {**task.env, "ORCH_NODES": "4", "ORCH_PYTHON": "/opt/py", "ORCH_NODE_RANK": "1"}
    assert "ORCH_NODE_RANK" not in task.env and task.node_rank == 0 and task.slot == -1
    changed = ("env", "host", "node_rank", "node_hosts", "slot")
    assert {k: v for k, v in asdict(node).items() if k not in changed} == {
        k: v for k, v in asdict(task).items() if k not in changed
    }


def test_a_task_cannot_be_changed_once_built():
    task = _task()
    with pytest.raises(FrozenInstanceError):
        task.replaces = "i-0abc"


# What a task holds that is mutable (its dicts and lists) and the calls that would change it in place.
_CONTAINERS = ("env", "data", "rungs")
_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove", "sort"}


def _task_changes(path: Path):
    """(line, code) of every in-place change of a task's env, data or rungs (an expression `<...task...>.env`, any
    name holding "task", assigned into, deleted from or called a mutator on) and of every setattr on a task."""

    def held(expr) -> bool:
        return isinstance(expr, ast.Attribute) and expr.attr in _CONTAINERS and "task" in ast.unparse(expr.value)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            targets = []
        for t in targets:
            if held(t) or isinstance(t, ast.Subscript) and held(t.value):
                yield node.lineno, ast.unparse(t)
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
            and held(node.func.value)
            or func in ("setattr", "object.__setattr__")
            and node.args
            and "task" in ast.unparse(node.args[0])
        ):
            yield node.lineno, func


def test_no_code_changes_a_task_in_place():
    root = Path(__file__).resolve().parents[3]
    found = [
        f"{path.relative_to(root)}:{line}: {what}"
        for path in sorted((root / "orchestrator").rglob("*.py"))
        for line, what in _task_changes(path)
    ]
    assert not found, "build a task whole (sweep/tasks.py: new_task, on_host), never change one:\n" + "\n".join(found)


def test_the_task_check_finds_each_kind_of_change(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(task, self, env):\n"
        "    task.env['X'] = '1'\n"
        "    self.task.env.update(Y='2')\n"
        "    del task.env['Z']\n"
        "    task.data.append({})\n"
        "    setattr(task, 'slot', 1)\n"
        "    env['X'] = task.env['X']\n"  # a copy's change, and a read: fine
        "    env = {**task.env, 'X': '1'}\n"
    )
    assert sorted(line for line, _ in _task_changes(bad)) == [2, 3, 4, 5, 6]


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
