"""Interruptions on the local backend: chaos interrupt -> resume, a broken checkpoint in the store, the checkpoint
made on `orch down`, a notice that kills a command without a handler, and a run's tmux session killed under it.
(The controller's decisions, a pure function: tests/unit/control/test_controller.py.)"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, no_traceback, starts
from tests.conftest import run_states as status
from tests.e2e.local.test_ddp import _step
from tests.unit.trainer.test_train import SMALL, final_weights, run_trainer, same

pytestmark = pytest.mark.slow

LONGER = [*SMALL, "--epochs", "8"]  # 128 steps: time to interrupt it mid-run
TRAIN = " ".join(["{python}", "-m", "trainer", *LONGER, "--log-every", "1"])


@pytest.fixture
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    run_trainer([*LONGER, "--out", str(out)])
    return out


def test_chaos_interrupt_resumes_to_the_same_result(orch, reference):
    path = orch.sweep(f'name: chaos\ncommand: "{TRAIN}"\nmax_restarts: 0\nstore: store\n')
    assert orch("launch", str(path), "--detach").code == 0
    # on the run's own disk, at once: through `orch status` under load the step came seconds late, and the run had
    # ended before the notice (seen at load 8)
    metrics = orch.home / "work" / "chaos" / "run" / "run" / "metrics.jsonl"
    retry_until(lambda: _step(metrics) >= 20, 120, 0.1, "training past step 20")
    r = orch("chaos", "interrupt", "run")
    assert r.code == 0 and "spot interruption notice; checkpoint step" in r.out, r.out + r.err
    retry_until(
        lambda: status(orch, "chaos")["run"]["state"] in ("succeeded", "failed"), 180, 0.5, "the resumed run to end"
    )
    final = status(orch, "chaos")["run"]
    assert (final["state"], final["attempt"], final["preemptions"], final["failures"]) == ("succeeded", 2, 1, 0)
    log2 = orch("logs", "run", "--attempt", "2").out
    assert "resumed from" in log2
    assert same(final_weights(reference), final_weights(orch.store("chaos", "run")))
    ref_last = json.loads((reference / "metrics.jsonl").read_text().splitlines()[-1])
    got_last = json.loads(orch.store("chaos", "run", "metrics.jsonl").read_text().splitlines()[-1])
    assert (ref_last["test_acc"], ref_last["train_loss"]) == (got_last["test_acc"], got_last["train_loss"])


@pytest.mark.timeout(300)
def test_the_checkpoint_made_on_orch_down_reaches_the_store(orch):
    """`orch down` stops the command with SIGTERM, and the trainer checkpoints on it: that checkpoint must reach
    the store, or on AWS (the instance then terminated) the next launch continues from an older one. Here the
    trainer checkpoints on the stop only (no checkpoint by epoch or time)."""
    args = [*SMALL, "--epochs", "400", "--ckpt-every-epochs", "0", "--log-every", "1"]
    path = orch.sweep(f'name: stopped\ncommand: "{" ".join(["{python}", "-m", "trainer", *args])}"\nstore: store\n')
    assert orch("launch", str(path), "--detach").code == 0
    metrics = orch.home / "work" / "stopped" / "run" / "run" / "metrics.jsonl"
    retry_until(lambda: _step(metrics) >= 3, 120, 0.1, "training past step 3")
    assert orch("down", "stopped").code == 0
    made = sorted(int(p.parent.name) for p in (metrics.parent / "ckpt").glob("*/MANIFEST.json"))
    stored = sorted(int(p.parent.name) for p in orch.store("stopped", "run").glob("ckpt/*/MANIFEST.json"))
    assert made and stored == made, (made, stored)  # the stop's checkpoint, and only it


@pytest.mark.timeout(400)
def test_corrupted_newest_checkpoint_in_the_store_falls_back(orch, reference):
    path = orch.sweep(f'name: corrupt\ncommand: "{TRAIN}"\nstore: store\n')
    assert orch("launch", str(path), "--detach").code == 0

    def two_checkpoints():
        found = sorted(int(p.parent.name) for p in orch.store("corrupt", "run").glob("ckpt/*/MANIFEST.json"))
        return found if len(found) >= 2 else None

    retry_until(two_checkpoints, 120, 0.2, "two checkpoints in the store")
    assert orch("down", "corrupt").code == 0
    newest = max(int(p.parent.name) for p in orch.store("corrupt", "run").glob("ckpt/*/MANIFEST.json"))
    blob = orch.store("corrupt", "run", "ckpt", str(newest), "state.pt")
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: as a bad upload would leave it
    blob.write_bytes(bytes(data))
    # The work folder goes, as a new host has none: the store's checkpoints are the ones on trial here.
    shutil.rmtree(orch.home / "work" / "corrupt" / "run" / "run")
    r = orch("launch", str(path), timeout=300)
    assert r.code == 0, r.out + r.err
    log2 = orch("logs", "run", "--attempt", "2").out
    assert "skipping checkpoint" in log2 and "checksum" in log2
    assert same(final_weights(reference), final_weights(orch.store("corrupt", "run")))


def test_a_notice_that_kills_a_command_without_a_handler_is_a_preemption(orch):
    path = orch.sweep("""
        name: nohandler
        command: "[ $ORCH_ATTEMPT = 1 ] && sleep 60; exit 0"
        max_restarts: 0
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "nohandler").get("run", {}).get("state") == "running", 30, 0.2, "the run to start")
    r = orch("chaos", "interrupt", "run", "--grace", "20", timeout=120)
    no_traceback(r)
    retry_until(
        lambda: status(orch, "nohandler", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        90,
        0.5,
        "the run to end",
    )
    v = status(orch, "nohandler")["run"]
    assert (v["state"], v["attempt"], v["failures"], v["preemptions"]) == ("succeeded", 2, 0, 1), v


@pytest.mark.slow
def test_killing_a_runs_tmux_session_restarts_it_and_the_old_agent_leaves_the_new_attempt_alone(orch, job):
    path = orch.sweep(f"""
        name: killed
        command: "{job(steps=2, release=True)}"
        max_restarts: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "killed").get("run", {}).get("state") == "running", 60, 0.3, "attempt 1 to run")
    # (`running` is recorded as the command's window opens; its start mark comes a moment later)
    retry_until(lambda: len(starts(job.marks)) == 1, 60, 0.1, "attempt 1's command to start")
    assert orch.tmux("kill-session", "-t", "=orch_killed_run").returncode == 0
    retry_until(
        lambda: (v := status(orch, "killed")["run"])["attempt"] == 2 and v["state"] == "running",
        120,
        0.3,
        "attempt 2 to run",
    )

    def agents(attempt):
        return [
            line
            for line in os.popen("ps -eo args").read().splitlines()
            if "orchestrator.host.agent" in line and f"task-{attempt}.json" in line
        ]

    retry_until(
        lambda: not agents(1), 120, 0.3, "attempt 1's agent to finish"
    )  # it used to SIGKILL attempt 2 on its way out
    assert status(orch, "killed")["run"]["state"] == "running"
    job.release.touch()
    retry_until(
        lambda: status(orch, "killed", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        120,
        0.3,
        "the run to end",
    )
    v = status(orch, "killed")["run"]
    assert v["state"] == "succeeded" and v["attempt"] == 2 and v["failures"] == 0, v
    assert [a for _, a in starts(job.marks)] == ["1", "2"]


def test_chaos_drop_kills_the_session_and_the_run_starts_again(orch, job):
    """No notice, no checkpoint: the run's session goes, and the controller starts it again (a lost host: not
    counted against max_restarts). Resuming from a checkpoint after a lost host: test_spot's and the ssh tests."""
    path = orch.sweep(f'name: drop\ncommand: "{job(release=True)}"\nmax_restarts: 0\nstore: store\nworkdir: null\n')
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: len(starts(job.marks)) == 1, 60, 0.2, "the run started")
    r = orch("chaos", "drop", "run")
    assert r.code == 0 and "without warning" in r.out, r.out + r.err
    retry_until(lambda: len(starts(job.marks)) == 2, 60, 0.2, "the run started again")
    job.release.touch()
    retry_until(lambda: status(orch, "drop")["run"]["state"] in ("succeeded", "failed"), 60, 0.5, "the run's end")
    final = status(orch, "drop")["run"]
    assert (final["state"], final["attempt"], final["failures"]) == ("succeeded", 2, 0), final
    assert not (job.marks / "DUPLICATE").exists()
