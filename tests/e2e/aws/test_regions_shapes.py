"""Sweeps of other shapes across regions (docs/guides/regions.md): a multi-node run and a `search:` with `prune:` and
`target:`, on the fake cloud with two regions whose first refuses capacity in every pool, so that everything runs in
the second, unchanged."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest

from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.e2e.aws import test_regions as regions
from tests.e2e.aws.test_regions import WEST, no_capacity, with_regions
from tests.fakecloud import BUCKET, REGION

pytestmark = pytest.mark.slow

clouds = regions.clouds  # the same fixture: a fake cloud with two regions (us-east-1, us-west-2)
EVER = ("pending", "running", "shutting-down", "terminated")


@pytest.mark.timeout(600)
def test_a_multi_node_run_gets_all_its_nodes_in_one_az_of_the_next_region(orch, clouds, identity):
    no_capacity(clouds, REGION)
    command = "echo $ORCH_NODE_RANK/$ORCH_NODES $ORCH_MASTER_ADDR > $ORCH_RUN_DIR/node$ORCH_NODE_RANK.txt"
    text = clouds.sweep_yaml("mnr", identity, command, extra="max_restarts: 0\nresources:\n  nodes: 2")
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    r = orch("launch", str(path), timeout=500)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    retry_until(lambda: not clouds.instances("mnr"), 120, 1.0, "both nodes to end with the run, without orch down")
    v = status(orch, "mnr")["run"]
    assert (v["state"], v["attempt"]) == ("succeeded", 1), v
    nodes = clouds.instances("mnr", states=EVER)
    assert len(nodes) == 2 and {i["region"] for i in nodes} == {WEST}, nodes
    assert len({i["az"] for i in nodes}) == 1, nodes  # all nodes in one AZ of us-west-2
    placed = {clouds.gate.placement.members.get(i["id"]) for i in nodes}
    assert placed == {(f"orch-mnr-{nodes[0]['az']}", nodes[0]["az"])}, placed  # and one cluster group there
    first, second = sorted(nodes, key=lambda i: i["id"])  # orch ranks the nodes by instance id
    said = clouds.client("s3").get_object(Bucket=BUCKET, Key="sweeps/mnr/run/node0.txt")["Body"].read().decode()
    assert said.split() == ["0/2", first["ip"]], said  # node 0's folder reaches the store; node 1's stays on its disk
    (node1,) = (clouds.root / "hosts" / second["id"] / "home" / "orch" / "runs" / "mnr").rglob("node1.txt")
    assert node1.read_text().split() == ["1/2", first["ip"]]
    down = orch("down", "mnr", timeout=300)
    assert down.code == 0, down.out + down.err
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("mnr", region).values()), region
        assert not clouds.client("ec2", region).describe_placement_groups()["PlacementGroups"], region


# Trial N's test_acc is 0.6 - 0.1 N at epoch 1 and 0.9 - 0.1 N at epoch 2: trial 0 is the best at the rung and the
# only one to reach the target (0.85). A later trial waits at the rung for its verdict, and goes on only if none comes.
CURVE = textwrap.dedent("""
    import json, os, time
    n = int(os.environ["ORCH_RUN_ID"].split("=")[1])
    t0 = time.time()
    def line(epoch):
        with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "test_acc": round(0.3 + 0.3 * epoch - 0.1 * n, 2),
                                "elapsed_s": time.time() - t0 + 0.1, "time": time.time()}) + "\\n")
    line(1)
    time.sleep(120 if n else 0)
    line(2)
""")
SEARCH = """\
max_parallel: 1
max_restarts: 0
target: {metric: test_acc, value: 0.85}
prune: {at: epoch, rungs: [1], keep: 0.5, min_runs: 2}
search:
  sampler: random
  trials: 3
  seed: 0
  space:
    lr: {low: 0.01, high: 1.0, log: true}"""


@pytest.mark.timeout(900)
def test_a_search_with_prune_and_target_runs_its_trials_in_the_next_region(orch, clouds, identity, tmp_path):
    no_capacity(clouds, REGION)
    script = tmp_path / "curve.py"
    script.write_text(CURVE)
    text = clouds.sweep_yaml("srch", identity, f"{{python}} {script}", extra=SEARCH)
    path = orch.sweep(with_regions(text, f"[{REGION}, {WEST}]"))
    r = orch("launch", str(path), timeout=800)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    retry_until(lambda: not clouds.instances("srch"), 120, 1.0, "every trial's instance to end, the pruned ones too")
    final = status(orch, "srch")
    assert {k: v["state"] for k, v in final.items()} == {
        "trial=0": "succeeded",
        "trial=1": "pruned",  # at rung 1: 0.5 against trial 0's 0.6 (2 runs there, keep 1)
        "trial=2": "pruned",  # 0.4 against the best of 3 (keep 1)
    }, final
    ran = clouds.instances("srch", states=EVER)
    assert len(ran) == 3 and {i["region"] for i in ran} == {WEST}, ran
    study = json.loads(clouds.client("s3").get_object(Bucket=BUCKET, Key="sweeps/srch/study.json")["Body"].read())
    told = {t["number"]: (t["outcome"], t["value"], t["intermediate"]) for t in study["trials"]}
    assert told == {
        0: ("complete", 0.9, {}),
        1: ("pruned", None, {"1": 0.5}),
        2: ("pruned", None, {"1": 0.4}),
    }, told  # the sampler was told each trial's value, or PRUNED with its value at the rung
    out = tmp_path / "out"
    c = orch("collect", "srch", "--out", str(out), "--wide")
    assert c.code == 0, c.out + c.err
    rows = {row["run_id"]: row for row in csv.DictReader(open(out / "runs.csv"))}
    assert [k for k, row in rows.items() if row["reached"] == "True"] == ["trial=0"], rows
    assert float(rows["trial=0"]["usd_to_target"]) > 0, rows["trial=0"]  # priced at us-west-2's spot price
    assert rows["trial=0"]["region"] == WEST, rows["trial=0"]
    assert "best trial: trial=0" in c.out, c.out
    assert orch("down", "srch").code == 0
    for region in (REGION, WEST):
        assert not any(clouds.leftovers("srch", region).values()), region


def test_the_fake_clouds_placement_groups_belong_to_their_region(clouds):
    """As EC2's: a group made in one region is unknown in another, which may make its own of the same name (so a test
    cannot pass on a multi-node launch that used another region's group)."""
    from botocore.exceptions import ClientError

    east, west = clouds.client("ec2", REGION), clouds.client("ec2", WEST)
    east.create_placement_group(GroupName="pg-here", Strategy="cluster")
    try:
        assert not west.describe_placement_groups()["PlacementGroups"]
        with pytest.raises(ClientError, match="InvalidPlacementGroup.Unknown"):
            west.delete_placement_group(GroupName="pg-here")
        west.create_placement_group(GroupName="pg-here", Strategy="cluster")
        assert [g["GroupName"] for g in west.describe_placement_groups()["PlacementGroups"]] == ["pg-here"]
        west.delete_placement_group(GroupName="pg-here")
    finally:
        east.delete_placement_group(GroupName="pg-here")
    assert not east.describe_placement_groups()["PlacementGroups"]
