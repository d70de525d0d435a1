"""A run's command on the local backend: params, env and the command stay data however they are quoted, a command
that cannot parse is a failed attempt with its error, a background child does not hold the run, a short timeout acts
at once, and the nodes of a run end together."""

from __future__ import annotations

import json
import os
import time

import pytest

from orchestrator.wait import retry_until
from tests.conftest import finish
from tests.conftest import run_states as status

METACHARS = [
    "`touch {m}/bt`",
    "$(touch {m}/dollar)",
    "a; touch {m}/semi",
    'it\'s "quoted"',
    "back\\slash",
    "two\nlines",
    "trail\\",
]


@pytest.mark.slow
def test_shell_metacharacters_in_params_env_and_commands_stay_data(orch, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    values = [v.format(m=marks) for v in METACHARS]
    path = orch.sweep(
        json.dumps(
            {
                "name": "meta",
                "command": "printf '<%s>\\n' {c} \"$V\"; echo 'cmd `touch " + str(marks) + "/incmd` ok'",
                "grid": {"c": values},
                "env": {"V": f"$(touch {marks}/env)`touch {marks}/env2`"},
                "max_parallel": 4,
                "store": "store",
            }
        )
    )
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    assert list(marks.iterdir()) == []  # nothing ran
    for run_id in status(orch, "meta"):
        log = orch("logs", run_id).out
        assert f"$(touch {marks}/env)`touch {marks}/env2`" in log and "cmd `touch" in log
    logs = "".join(orch("logs", r).out for r in status(orch, "meta"))
    for v in values:
        assert f"<{v}>" in logs, v


@pytest.mark.slow
def test_a_command_that_cannot_parse_is_a_failed_attempt_with_its_error(orch):
    path = orch.sweep("""
        name: broken
        command: "echo 'unterminated"
        max_restarts: 0
        store: store
    """)
    r = finish(orch, path)
    assert r.code == 1
    v = status(orch, "broken")["run"]
    assert v["state"] == "failed" and v["exit_code"] not in (None, 0)
    assert "unexpected EOF" in orch("logs", "run").out
    path = orch.sweep("name: trailing\ncommand: 'echo hi \\'\nmax_restarts: 0\nstore: store\n", name="t.yaml")
    finish(orch, path)
    assert status(orch, "trailing")["run"]["state"] == "succeeded"  # bash takes a trailing backslash literally (exit 0)
    assert "hi \\" in orch("logs", "trailing/run").out


@pytest.mark.slow
def test_a_background_child_does_not_hold_the_run(orch, tmp_path):
    pidfile = tmp_path / "child.pid"
    path = orch.sweep(f"""
        name: bg
        command: "sleep 40 & echo $! > {pidfile}; echo x; exit 0"
        timeout_minutes: 0.5
        store: store
    """)
    t0 = time.time()
    r = finish(orch, path)
    assert r.code == 0 and status(orch, "bg")["run"]["state"] == "succeeded", r.out
    assert time.time() - t0 < 30  # the command ended at once; its orphan did not keep the run going
    child = int(pidfile.read_text())
    retry_until(
        lambda: not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z",
        15,
        0.2,
        "the orphan to be stopped",
    )


@pytest.mark.slow
def test_short_timeouts_act_quickly_and_read_right(orch):
    path = orch.sweep("name: quick\ncommand: 'sleep 60'\ntimeout_minutes: 0.05\nmax_restarts: 0\nstore: store\n")
    t0 = time.time()
    finish(orch, path)
    v = status(orch, "quick")["run"]
    assert v["state"] == "failed" and "3 s" in v["reason"], v
    assert time.time() - t0 < 25


@pytest.mark.slow
def test_a_local_node_that_crashes_fails_the_run_at_once_with_its_code(orch):
    path = orch.sweep("""
        name: nodecrash
        command: 'if [ "$ORCH_NODE_RANK" = 1 ]; then exit 3; fi; exec sleep 3600'
        resources: {nodes: 2}
        max_restarts: 0
        store: store
    """)
    orch("launch", str(path), timeout=120)  # without the fix node 0 sleeps on: the launch times out
    v = status(orch, "nodecrash")["run"]
    assert v["state"] == "failed" and v["exit_code"] == 3, v
    assert "sleep 3600" not in os.popen("ps -eo args").read()


@pytest.mark.slow
def test_a_local_run_of_two_nodes_keeps_each_nodes_log_in_the_store(orch):
    path = orch.sweep("""
        name: nodelogs
        command: 'echo "node $ORCH_NODE_RANK of $ORCH_NODES speaks"'
        resources: {nodes: 2}
        max_restarts: 0
        store: store
    """)
    assert finish(orch, path).code == 0
    zero, one = orch("logs", "nodelogs/run"), orch("logs", "nodelogs/run", "--node", "1")
    assert one.code == 0 and "node 1 of 2 speaks" in one.out and "node 0 of 2" not in one.out, one.out + one.err
    assert "node 0 of 2 speaks" in zero.out and "node 1 of 2" not in zero.out, zero.out  # as on aws: a log per node
    assert (orch.store("nodelogs", ".orch", "run", "node-logs", "1", "1.log")).is_file()
