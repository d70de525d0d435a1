"""Spot reliability on the local backend: chaos interrupt -> resume, broken checkpoint in the store,
and the controller's decisions (pure function)."""

from __future__ import annotations

import json
import shutil

import pytest

from orchestrator.backends.base import Host
from orchestrator.control.controller import DONE, REPLACE, START, WAIT, decide
from orchestrator.store.status import RunStatus
from orchestrator.wait import retry_until
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


# --- decisions ------------------------------------------------------------------------------------

NOW = 1_000_000.0


def st(state, **kw):
    return RunStatus(run_id="r", state=state, **kw)


@pytest.mark.parametrize(
    "status, host, want",
    [
        (st("succeeded"), None, DONE),
        (st("cancelled"), Host("r", "h", "a"), DONE),
        (st("running", heartbeat=NOW - 5), Host("r", "h", "a"), WAIT),
        (st("running", heartbeat=NOW - 500), Host("r", "h", "a"), REPLACE),  # silent agent: host lost
        (st("running", heartbeat=NOW - 5), None, START),  # host vanished
        (st("interrupted"), None, START),
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a"), REPLACE),  # orphan of a dead controller
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", provisioning=True), WAIT),
        (st("failed", failures=1), None, START),
        (st("failed", failures=2), None, DONE),
        (st("stopped"), None, START),
        # (a) the start timeout counts from the agent's start (a boot of minutes before it is not the agent's fault)
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", start_deadline=NOW + 10), WAIT),
        (st("starting", started_at=NOW - 500), Host("r", "i-1", "a", start_deadline=NOW - 1), REPLACE),
        (
            st("starting", started_at=NOW - 500, heartbeat=NOW - 5),
            Host("r", "i-1", "a", start_deadline=NOW - 1),
            WAIT,
        ),  # it reported: restoring
        (
            st("starting", started_at=NOW - 500, heartbeat=NOW - 500),
            Host("r", "i-1", "a"),
            REPLACE,
        ),  # reported, then went silent
        (st("failed", no_shows=3), None, DONE),  # hosts that never report end the run: no replacement loop
        (st("failed", quick_losses=5), None, DONE),  # attempts lost again and again soon after their claim: too
        (st("failed", failures=1, quick_losses=4), None, START),
        # a run on several instances needs every node of its attempt
        (st("running", heartbeat=NOW - 5), Host("r", "i-1", "a", nodes=2, missing=1), REPLACE),
        (st("starting", heartbeat=NOW - 5), Host("r", "i-1", "a", nodes=2, missing=1), REPLACE),
        (st("starting"), Host("r", "i-1", "a", nodes=2, missing=1, provisioning=True), WAIT),  # still being acquired
        (
            st("interrupted"),
            Host("r", "i-1", "a", nodes=2, missing=1),
            WAIT,
        ),  # the attempt ended: its nodes are on their way out
        (st("succeeded"), Host("r", "i-1", "a", nodes=2, missing=1), DONE),
    ],
)
def test_decide(status, host, want):
    assert decide(status, host, max_restarts=1, now=NOW, stale_s=60, start_timeout_s=60) == want


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
