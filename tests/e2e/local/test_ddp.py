"""train.py's own DDP path (torchrun, gloo, 2 processes) under orch, launched with `{torchrun}` and
`resources: procs_per_node: 2`: a spot notice mid-epoch reaches both ranks, they checkpoint at the
same step, and the resumed run ends bitwise equal to an uninterrupted run launched by hand."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S
from tests.conftest import run_states as status
from tests.unit.trainer.test_train import (
    EIGHT_PX,
    SMALL,
    STEPS_PER_EPOCH,
    _free_port,
    final_weights,
    same,
    trainer_env,
)

pytestmark = pytest.mark.slow


# Long enough that the notice lands mid-run: at 3 epochs the run could end (~2 s) before the notice
# reached it, and torchrun, sent SIGTERM while it wound down, printed a traceback.
ARGS = [*SMALL, "--epochs", "8"]


def _step(path) -> int:
    try:
        lines = path.read_text().splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def torchrun(port: int) -> list:
    return [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
    ]


@pytest.mark.timeout(600)
def test_ddp_run_interrupted_by_a_notice_resumes_bitwise(orch, tmp_path):
    ref = tmp_path / "ref"
    p = subprocess.run(
        [sys.executable, *torchrun(_free_port()), "-m", "trainer", *ARGS, "--out", str(ref)],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]

    command = " ".join(["{torchrun}", "-m", "trainer", *ARGS, "--log-every", "1"])  # the rendezvous comes from orch
    path = orch.sweep(f"""
        name: ddp
        command: "{command}"
        max_restarts: 0
        store: store
        resources:
          procs_per_node: 2
        local:
          threads_per_run: 1
    """)
    assert orch("launch", str(path), "--detach").code == 0
    metrics = orch.home / "work" / "ddp" / "run" / "run" / "metrics.jsonl"
    retry_until(lambda: _step(metrics) >= STEPS_PER_EPOCH + 3, 240, 0.05, "training to pass into epoch 2")
    r = orch("chaos", "interrupt", "run", "--grace", "60", timeout=120)
    assert r.code == 0, r.out + r.err
    retry_until(
        lambda: status(orch, "ddp", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        300,
        0.5,
        "the run to end",
    )
    v = status(orch, "ddp")["run"]
    assert (v["state"], v["attempt"], v["failures"], v["preemptions"]) == ("succeeded", 2, 0, 1), v
    log1 = orch("logs", "run", "--attempt", "1").out
    # Both ranks checkpointed on the notice and again on the stop; the stop goes to torchrun, which
    # forwards SIGTERM to the ranks and ends with its own SignalException traceback (torchrun's way,
    # not a crash): no frame of the trainer may be in any traceback.
    assert log1.count("checkpoint") >= 2 and "SIGTERM: checkpointed" in log1, log1[-2000:]
    assert not re.search(r'File "[^"]*/trainer/[^"/]+\.py"', log1), log1[-3000:]  # a frame of trainer/*.py
    summary = (orch.home / "work" / "ddp" / "run" / "run" / "summary.json").read_text()
    assert '"world_size": 2' in summary
    assert same(final_weights(ref), final_weights(orch.home / "work" / "ddp" / "run" / "run"))


@pytest.mark.timeout(600)
def test_two_local_nodes_of_two_processes_equal_one_node_of_four(orch):
    """`resources: nodes: 2` locally: two node process groups with a loopback rendezvous, world size 4,
    and the same final weights as one node of four processes."""
    command = " ".join(["{torchrun}", "-m", "trainer", *EIGHT_PX, "--epochs", "1", "--synthetic-train", "512"])
    for name, nodes, procs in (("nodes2", 2, 2), ("nodes1", 1, 4)):
        path = orch.sweep(
            f"""
            name: {name}
            command: "{command}"
            max_restarts: 0
            store: store
            resources:
              nodes: {nodes}
              procs_per_node: {procs}
            local:
              threads_per_run: 1
        """,
            name=f"{name}.yaml",
        )
        r = orch("launch", str(path), timeout=400)
        assert r.code == 0, r.out[-2000:] + r.err[-2000:]
        summary = json.loads((orch.home / "work" / name / "run" / "run" / "summary.json").read_text())
        assert summary["world_size"] == 4, summary
    assert same(
        final_weights(orch.home / "work" / "nodes2" / "run" / "run"),
        final_weights(orch.home / "work" / "nodes1" / "run" / "run"),
    )


@pytest.mark.timeout(600)
def test_four_ranks_resumed_mid_epoch_reduce_as_the_run_they_continue(tmp_path):
    """With 3+ ranks the order of a gradient sum depends on DDP's bucket layout, which it sets by its
    first backward: a resumed run must lay them out as the run it continues (before the fix its first
    resumed step summed in another order, and the weights drifted by ~1e-8)."""
    args = [*EIGHT_PX, "--epochs", "2", "--ckpt-keep", "100", "--synthetic-train", "512"]  # 8 steps an epoch

    def run(out, *extra):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "4",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(_free_port()),
                "-m",
                "trainer",
                *args,
                "--out",
                str(out),
                *extra,
            ],
            env=trainer_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        return p

    run(tmp_path / "whole")
    run(
        tmp_path / "stopped", "--max-steps", "12", "--ckpt-every-s", "0.00001"
    )  # a checkpoint at step 12 of 16, mid-epoch 2
    assert "resumed from" in run(tmp_path / "stopped").stderr
    assert same(final_weights(tmp_path / "whole"), final_weights(tmp_path / "stopped"))
