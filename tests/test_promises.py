"""What the README promises about the local CLI and had no test of its own: `logs -f`, `status --watch`,
`threads_per_run` and its default, `{sweep}`, SWEEP/RUN when two sweeps share a run id, "lowest *loss" in
collect, the second launch of a running sweep, a local `--dry-run`, and an agent that goes silent."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import threading

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, starts
from tests.conftest import run_states as status

pytestmark = pytest.mark.slow

PROBE = """
import json, os
out = os.environ["ORCH_RUN_DIR"]
import sys
print("threads", os.environ["OMP_NUM_THREADS"], "sweep", sys.argv[1], os.environ["ORCH_SWEEP"], flush=True)
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    for step, (loss, acc) in enumerate([(3.0, 0.1), (1.0, 0.9), (2.0, 0.5)]):
        f.write(json.dumps({"step": step, "val_loss": loss, "val_acc": acc}) + "\\n")
"""


def running(orch, job, name: str):
    """A one-run sweep of the release job, launched in the background and running; returns its file."""
    path = orch.sweep(
        f"""
        name: {name}
        command: "{job(steps=2, release=True)}"
        store: store
    """,
        name=f"{name}.yaml",
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, name).get("run", {}).get("state") == "running", 60, 0.3, "the run to start")
    return path


def test_logs_follow_and_status_watch_run_until_the_sweep_ends(orch, job):
    running(orch, job, "follow")
    logs = orch.popen("logs", "run", "-f")
    watch = orch.popen("status", "follow", "--watch")
    seen: list = []
    reader = threading.Thread(target=lambda: seen.extend(iter(watch.stdout.readline, "")), daemon=True)
    reader.start()
    store_log = orch.store("follow", ".orch", "run", "logs", "1.log")
    retry_until(lambda: store_log.exists() and "tick 3" in store_log.read_text(), 60, 0.3, "the log to reach the store")
    # the watch has shown the run running before it may end (on a loaded machine its start can take seconds)
    retry_until(
        lambda: any("run: running (attempt 1)" in line for line in list(seen)),
        120,
        0.2,
        "the watch to show the run running",
    )
    assert logs.poll() is None and watch.poll() is None  # both keep following a running sweep
    job.release.touch()
    out_logs = logs.communicate(timeout=90)[0]
    watch.wait(timeout=90)
    reader.join(timeout=30)
    out_watch = "".join(seen)
    assert logs.returncode == 0 and "tick 0 of run" in out_logs and "finished run with code 0" in out_logs, out_logs
    assert watch.returncode == 0, out_watch
    assert "run: running (attempt 1)" in out_watch and "run: succeeded (attempt 1)" in out_watch, out_watch


def test_threads_per_run_ambiguous_run_ids_and_lowest_loss(orch, script):
    probe = script(PROBE, "probe.py")
    one = orch.sweep(
        f"""
        name: pinned
        command: "{{python}} {probe} {{sweep}}"
        store: store
        local:
          threads_per_run: 3
    """,
        "one.yaml",
    )
    two = orch.sweep(
        f"""
        name: shared
        command: "{{python}} {probe} {{sweep}}"
        max_parallel: 2
        store: store
    """,
        "two.yaml",
    )
    orch.env["OMP_NUM_THREADS"] = "7"  # the shell's value yields to the sweep's threads_per_run
    r = orch("launch", str(one))
    assert r.code == 0, r.out + r.err
    orch.env.pop("OMP_NUM_THREADS")  # and without one in the shell, the default is cores / max_parallel
    r = orch("launch", str(two))
    assert r.code == 0, r.out + r.err

    # both sweeps have a run called "run": the bare id is ambiguous, SWEEP/RUN is not
    r = orch("logs", "run")
    assert r.code != 0 and "pinned/run" in r.err and "shared/run" in r.err and "Traceback" not in r.err, r.err
    pinned, shared = orch("logs", "pinned/run"), orch("logs", "shared/run")
    assert "threads 3 sweep pinned pinned" in pinned.out, pinned.out
    default = max(1, (os.cpu_count() or 1) // min(2, os.cpu_count() or 1))  # cores / max_parallel
    assert f"threads {default} sweep shared shared" in shared.out, shared.out

    out = orch.tmp / "results"
    assert orch("collect", "pinned", "--out", str(out)).code == 0
    row = next(csv.DictReader(open(out / "runs.csv")))
    assert float(row["best_val_loss"]) == 1.0 and float(row["best_val_acc"]) == 0.9, row  # not the last values


def test_a_second_launch_of_a_running_sweep_launches_nothing(orch, job):
    path = running(orch, job, "twice")
    again = orch("launch", str(path))
    assert again.code != 0 and "already being run by controller pid" in again.err and "Traceback" not in again.err, (
        again.err
    )
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "nothing launched" in dry.out, dry.err
    job.release.touch()
    retry_until(
        lambda: status(orch, "twice", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 60, 0.3, "the run to end"
    )
    assert len(starts(job.marks)) == 1 and not (job.marks / "DUPLICATE").exists()


def test_local_dry_run_lists_runs_and_starts_nothing(orch, job):
    path = orch.sweep(f"""
        name: dry
        command: "{job(steps=1)} --lr {{lr}}"
        grid:
          lr: [0.1, 0.2]
        store: store
    """)
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.err
    assert "lr=0.1" in r.out and "lr=0.2" in r.out and "--lr 0.2" in r.out and "nothing launched" in r.out, r.out
    assert orch.tmux("has-session").returncode != 0  # no tmux server, so no run
    assert not orch.store("dry").exists() and starts(job.marks) == []
    assert "dry" not in orch("status").out


def test_an_agent_that_goes_silent_loses_its_host_and_the_run_restarts(orch, job):
    """The local backend's stale limit (30 s) end to end: the agent is stopped (SIGSTOP), the
    controller calls the host lost, stops what is left of the attempt, and starts attempt 2."""
    running(orch, job, "silent")
    agent_pid = int((orch.home / "work" / "silent" / "run" / "ctl" / "agent.pid").read_text())
    os.kill(agent_pid, signal.SIGSTOP)
    try:
        retry_until(lambda: status(orch, "silent")["run"]["attempt"] == 2, 120, 1.0, "attempt 2 after the stale limit")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent_pid, signal.SIGCONT)
    # the old agent, woken up, finds its record taken over: it writes nothing (one writer per record) and exits
    retry_until(
        lambda: subprocess.run(["kill", "-0", str(agent_pid)], capture_output=True).returncode != 0,
        60,
        0.5,
        "the woken agent to exit",
    )
    v = status(orch, "silent")["run"]
    assert (v["state"], v["attempt"], v["preemptions"], v["failures"]) == ("running", 2, 1, 0), v
    job.release.touch()
    retry_until(
        lambda: status(orch, "silent", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 90, 0.5, "attempt 2 to finish"
    )
    assert [a for _, a in starts(job.marks)] == ["1", "2"]
    assert not (job.marks / "DUPLICATE").exists()  # attempt 1's command was stopped before attempt 2 began
