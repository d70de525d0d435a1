"""Runs that span several instances (`resources: nodes: 2`) on the fake cloud: a real torchrun
rendezvous across two loopback hosts, acquired all at once in one AZ and one cluster placement
group; a spot notice on node 1 ends the attempt on both nodes through node 0's checkpoint; a node
that vanishes without notice ends it too; `orch down` leaves no placement group."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from orchestrator.contract import AGENT_LOG_FILE
from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, command_processes, held
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET
from tests.fakecloud.cloud import AZS
from tests.unit.trainer.test_train import EIGHT_PX, _free_port, final_weights, same, trainer_env

pytestmark = pytest.mark.slow

# 192 steps at 8 px (the weights are all this compares). The notice needs up to ~10 s to reach node 0 (node 1's IMDS
# poll, then node 0's poll of the relay, 5 s each): the ranks wait for it (SIGSTOP), so that moment is an event, not
# the run's speed; the steps after it leave node 0's agent time for its next look (5 s) before the run ends.
ARGS = [*EIGHT_PX, "--epochs", "12"]
FAST = {"heartbeat_s": "1", "sync_s": "2"}


def nodes_of(cloud, sweep: str, attempt: int) -> list:
    """Instance ids of an attempt, in node order (orch ranks the nodes by instance id)."""
    return sorted(
        i["id"]
        for i in cloud.instances(sweep, states=("pending", "running", "shutting-down", "terminated"))
        if i["tags"].get("orch:attempt") == str(attempt)
    )


def s3_bytes(cloud, key: str) -> bytes:
    return cloud.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read()


def newest_weights(cloud, prefix: str):
    s3 = cloud.client("s3")
    keys = [
        o["Key"]
        for p in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for o in p.get("Contents", [])
    ]
    step = max(int(k.split("/")[-2]) for k in keys if k.endswith("/MANIFEST.json") and "/ckpt/" in k)
    return torch.load(io.BytesIO(s3_bytes(cloud, f"{prefix}ckpt/{step}/state.pt")), weights_only=False)["model"]


@pytest.mark.timeout(900)
def test_two_nodes_of_two_processes_interrupted_on_node_1_end_as_one_node_of_four(orch, cloud, identity, tmp_path):
    ref = tmp_path / "ref"  # the same run as one node of four processes, launched by hand
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
            *ARGS,
            "--out",
            str(ref),
        ],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stderr[-3000:]

    command = " ".join(["{torchrun}", "-m", "trainer", *ARGS, "--log-every", "1"])
    path = orch.sweep(
        cloud.sweep_yaml(
            "mn", identity, command, extra="max_restarts: 0\nresources:\n  nodes: 2\n  procs_per_node: 2", **FAST
        )
    )
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "2 node(s); per node" in dry.out and "x 2 instances" in dry.out, dry.out + dry.err
    assert orch("launch", str(path), "--detach").code == 0

    def both_nodes():  # (one DescribeInstances a poll)
        ids = nodes_of(cloud, "mn", 1)
        return ids if len(ids) == 2 else None

    first = retry_until(both_nodes, 400, 0.5, "2 nodes")
    node0 = cloud.root / "hosts" / first[0] / "home" / "orch" / "runs" / "mn" / "run"

    def step() -> int:  # on node 0's own disk, at once: an `orch status` under load takes seconds, and the run
        try:  # could end before the notice reached it (seen at load 5-6: attempt 1 succeeded)
            return max(json.loads(m.read_text().splitlines()[-1]).get("step", 0) for m in node0.rglob("metrics.jsonl"))
        except (OSError, ValueError, IndexError):  # not there yet, or a line being written
            return 0

    retry_until(lambda: step() >= 3, 400, 0.2, "training to start")
    placed = {iid: cloud.gate.placement.members.get(iid) for iid in first}
    assert len({g for g, _ in placed.values()}) == 1 and len({az for _, az in placed.values()}) == 1, (
        placed
    )  # one group, one AZ
    ctls = [cloud.root / "hosts" / iid / "home" / "orch" / "runs" / "mn" / "run" / "ctl" for iid in first]
    ranks = [pid for ctl in ctls for pid in retry_until(lambda ctl=ctl: command_processes(ctl), 60, 0.2, "its command")]
    with held(ranks):  # every rank waits where it is until node 0's agent has the notice
        cloud.spot_notice(first[1])  # node 1's IMDS, as AWS gives it: node 0 must checkpoint for the run
        log0 = ctls[0] / AGENT_LOG_FILE
        retry_until(
            lambda: log0.exists() and "spot interruption notice" in log0.read_text(),
            120,
            0.2,
            "node 0's agent to ask its ranks to checkpoint",
        )

    retry_until(
        lambda: status(orch, "mn", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        600,
        1.0,
        "the run to end",
    )
    v = status(orch, "mn")["run"]
    assert (v["state"], v["attempt"], v["failures"], v["preemptions"]) == ("succeeded", 2, 0, 1), v
    log1 = orch("logs", "run", "--attempt", "1").out
    assert "checkpoint" in log1, log1[-2000:]
    assert b"spot notice on node 1" in s3_bytes(cloud, "sweeps/mn/.orch/run/notices/1")  # relayed through the store
    summary = json.loads(s3_bytes(cloud, "sweeps/mn/run/summary.json"))
    assert summary["world_size"] == 4, summary
    assert same(final_weights(ref), newest_weights(cloud, "sweeps/mn/run/"))
    second = nodes_of(cloud, "mn", 2)
    assert len(second) == 2 and not set(second) & set(first)  # a fresh set of two

    assert orch("down", "mn", timeout=300).code == 0
    groups = cloud.client("ec2").describe_placement_groups()["PlacementGroups"]
    assert groups == [], groups


@pytest.mark.timeout(600)
def test_nodes_come_all_at_once_and_a_lost_node_ends_the_attempt_on_every_node(orch, cloud, identity):
    # g5.xlarge, the cheaper (asked first: a run of several nodes asks the best-ranked pool first), gives one instance
    # at most: a 2-node run must not start half there, but on g6.xlarge
    for az in AZS:
        cloud.gate.spot_prices[("g5.xlarge", az)], cloud.gate.spot_prices[("g6.xlarge", az)] = 0.30, 0.40
    cloud.gate.fleet_capacity[("*", "g5.xlarge", "*")] = 1
    command = (
        "echo $ORCH_NODE_RANK/$ORCH_NODES $ORCH_MASTER_ADDR:$ORCH_MASTER_PORT $ORCH_RDZV_ID > "
        "$ORCH_RUN_DIR/node$ORCH_NODE_RANK.txt; "
        "if [ $ORCH_ATTEMPT = 1 ]; then sleep 600; fi"
    )
    path = orch.sweep(
        cloud.sweep_yaml("mn2", identity, command, extra="max_restarts: 0\nresources:\n  nodes: 2", **FAST)
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "mn2").get("run", {}).get("state") == "running", 120, 0.5, "attempt 1 to run")
    first = nodes_of(cloud, "mn2", 1)
    types = {
        i["id"]: cloud.client("ec2").describe_instances(InstanceIds=[i["id"]])["Reservations"][0]["Instances"][0][
            "InstanceType"
        ]
        for i in cloud.instances("mn2")
    }
    assert len(first) == 2 and set(types.values()) == {"g6.xlarge"}, types
    assert (
        cloud.gate.counts["InsufficientInstanceCapacity"] >= 1
    )  # g5 was asked for two and refused: nothing launched there
    retry_until(
        lambda: cloud.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="sweeps/mn2/run/node0.txt").get("KeyCount"),
        60,
        0.5,
        "node 0's file",
    )
    master = [i["ip"] for i in cloud.instances("mn2") if i["id"] == first[0]][0]
    line = s3_bytes(cloud, "sweeps/mn2/run/node0.txt").decode().split()
    assert line[0] == "0/2" and line[1].startswith(master + ":") and line[2] == "mn2-run-1", line

    cloud.reclaim(first[1])  # node 1 vanishes without a notice
    retry_until(
        lambda: status(orch, "mn2", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        300,
        0.5,
        "the run to end",
    )
    v = status(orch, "mn2")["run"]
    assert (v["state"], v["attempt"], v["preemptions"]) == ("succeeded", 2, 1), v
    retry_until(lambda: not cloud.instances("mn2"), 60, 0.5, "every node to be gone")  # node 0 of attempt 1 too
    assert orch("down", "mn2", timeout=300).code == 0


def failed_in_attempt_2(orch, sweep: str) -> dict:
    """The sweep's one run once `orch status` shows it failed in attempt 2. One read per check: two reads could see
    "failed" (attempt 1) and then attempt 2 already starting."""
    return retry_until(
        lambda: (lambda r: r if (r.get("state"), r.get("attempt")) == ("failed", 2) else None)(
            status(orch, sweep).get("run", {})
        ),
        400,
        0.5,
        "the run to fail on its second attempt",
    )


@pytest.mark.timeout(600)
def test_a_node_whose_command_fails_fails_the_attempt_and_counts_against_max_restarts(orch, cloud, identity):
    # node 1 always fails: the run must fail after max_restarts + 1 attempts, not be called lost and restarted forever
    command = "echo node $ORCH_NODE_RANK; if [ $ORCH_NODE_RANK = 1 ]; then exit 7; fi; sleep 600"
    path = orch.sweep(
        cloud.sweep_yaml("mnfail", identity, command, extra="max_restarts: 1\nresources:\n  nodes: 2", **FAST)
    )
    assert orch("launch", str(path), "--detach").code == 0
    v = failed_in_attempt_2(orch, "mnfail")
    assert (v["exit_code"], v["failures"], v["preemptions"]) == (7, 2, 0), v
    assert "node 1 exited with code 7" in v["reason"], v
    node1 = orch("logs", "run", "--node", "1")
    assert node1.code == 0 and "node 1" in node1.out, node1.out + node1.err
    assert orch("logs", "run", "--node", "2").code == 2
    retry_until(lambda: not cloud.instances("mnfail"), 120, 0.5, "every node to be gone")
    assert orch("down", "mnfail", timeout=300).code == 0


# Attempt 1: node 1's command fails while node 0's runs; attempt 2: node 0's fails while node 1's runs. The node that
# keeps running is stopped by orch (SIGTERM) and writes its last log line (node 0 also a metrics line) in its handler:
# only a sync after that stop carries them to the store (the periodic one, every 2 s, has passed by then).
NODE_FAILS = textwrap.dedent("""
    import json, os, signal, sys, time
    rank, attempt, ready = int(os.environ["ORCH_NODE_RANK"]), int(os.environ["ORCH_ATTEMPT"]), sys.argv[1]
    failing = 1 if attempt == 1 else 0
    def bye(*_):
        if rank == 0:
            with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"epoch": 2, "goodbye": attempt}) + "\\n")
        print(f"last words of node {rank} in attempt {attempt}", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, bye)
    if rank == 0 and attempt == 1:  # (the last metrics line of the run is then the one node 0 writes on its stop)
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": 1, "acc": 0.5}) + "\\n")
    print(f"node {rank} of attempt {attempt} runs", flush=True)
    mark = f"{ready}.{attempt}"
    if rank != failing:
        open(mark, "w").close()  # its handler is set: the other node may fail now
        time.sleep(600)
    for _ in range(1200):  # the other node's handler first (a SIGTERM before it would leave no last words)
        if os.path.exists(mark):
            break
        time.sleep(0.1)
    print(f"node {rank} fails", flush=True)
    sys.exit(7)
""")


@pytest.mark.timeout(600)
def test_an_attempt_ended_by_a_failed_node_keeps_every_nodes_log_and_the_run_folder(orch, cloud, identity, tmp_path):
    script = tmp_path / "nodes.py"
    script.write_text(NODE_FAILS)
    command = f"{{python}} {script} {tmp_path / 'ready'}"
    path = orch.sweep(
        cloud.sweep_yaml("mnkeep", identity, command, extra="max_restarts: 1\nresources:\n  nodes: 2", **FAST)
    )
    assert orch("launch", str(path), "--detach").code == 0
    v = failed_in_attempt_2(orch, "mnkeep")
    assert (v["exit_code"], v["failures"]) == (7, 2), v
    # read as soon as the end is recorded: every node's log reached the store before it
    for node, attempt, words in (
        (0, 1, "last words of node 0 in attempt 1"),  # it ran on when node 1 failed
        (1, 1, "node 1 fails"),
        (0, 2, "node 0 fails"),
        (1, 2, "last words of node 1 in attempt 2"),  # it ran on when node 0 failed
    ):
        got = orch("logs", "run", "--node", str(node), "--attempt", str(attempt))
        assert got.code == 0 and words in got.out, (node, attempt, got.out + got.err)
    out = tmp_path / "res"
    c = orch("collect", "mnkeep", "--out", str(out))
    assert c.code == 0, c.err
    row = json.loads((out / "runs.json").read_text())["runs"][0]
    assert row["goodbye"] == 1, row  # node 0's line written on the stop of attempt 1, in the run folder
    retry_until(lambda: not cloud.instances("mnkeep"), 120, 0.5, "every node to be gone")
    assert orch("down", "mnkeep", timeout=300).code == 0
