"""`workdir:` and `setup:` on the fake cloud, through `orch launch`: the user's own project (script, helper module,
relative config, a setup step the script depends on) runs on instances that have none of it; runs packed on one
instance share one unpacked copy and one setup (counted on the host); the snapshot reaches hosts through the store,
is what runs.csv names, and a project over the cap is refused before anything is bought."""

from __future__ import annotations

import csv
import json
import os

import pytest

from tests.conftest import no_traceback, run_states
from tests.e2e.local.test_workdir import TRAIN
from tests.fakecloud import BUCKET

pytestmark = pytest.mark.slow

# the host's own home: `$HOME/deps` is where setup installs and where the script looks
SETUP = "mkdir -p $HOME/deps && echo VALUE = 40 > $HOME/deps/dep.py && echo once >> $HOME/deps/setups"


def aws_project(orch, cloud, identity, name: str, extra: str = "") -> None:
    root = orch.tmp
    (root / "train.py").write_text(TRAIN)
    (root / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (root / "conf").mkdir(exist_ok=True)
    (root / "conf" / "config.json").write_text('{"bias": 0.5}')
    text = cloud.sweep_yaml(
        name,
        identity,
        "DEPS=$HOME/deps python3 train.py --lr {lr}",
        extra=f"grid:\n  lr: [0.1, 0.2, 0.3]\nmax_parallel: 3\nmax_restarts: 0\nsetup: '{SETUP}'\n"
        "resources:\n  gpus: 1\n" + extra,
        instance_types="[g5.12xlarge]",  # 4 GPUs: the three runs share one instance
    )
    return orch.sweep(text)


@pytest.mark.timeout(600)
def test_a_users_project_runs_on_a_packed_instance_with_one_copy_and_one_setup(orch, cloud, identity):
    path = aws_project(orch, cloud, identity, "own")
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "code: " in dry.out and "setup (once per host" in dry.out, dry.out + dry.err
    r = orch("launch", str(path), timeout=500)
    no_traceback(r)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    states = run_states(orch, "own")
    assert {s["state"] for s in states.values()} == {"succeeded"}, states

    homes = [p.parent for p in (cloud.root / "hosts").glob("*/home/deps")]
    assert len(homes) == 1, homes  # one instance held the three runs
    assert (homes[0] / "deps" / "setups").read_text() == "once\n"  # setup ran once on it
    s3 = cloud.client("s3")
    record = json.loads(s3.get_object(Bucket=BUCKET, Key="sweeps/own/sweep.json")["Body"].read())
    digest = record["code"]["digest"]
    unpacked = list((homes[0] / "orch" / "runs" / ".code").glob("*.ok"))
    assert [p.name for p in unpacked if ".setup-" not in p.name] == [f"{digest}.ok"]  # one copy, by content
    logs = [s3.get_object(Bucket=BUCKET, Key=f"sweeps/own/.orch/{run}/logs/1.log")["Body"].read() for run in states]
    assert sum(b"fetched and unpacked" in log for log in logs) == 1, logs

    c = orch("collect", "own", "--out", str(orch.tmp / "res"))
    assert c.code == 0, c.err
    with open(orch.tmp / "res" / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert {row["code"] for row in rows} == {digest}
    assert sorted(float(row["test_acc"]) for row in rows) == pytest.approx([40.7, 40.9, 41.1])
    assert orch("down", "own").code == 0


def test_a_project_over_the_cap_buys_nothing(orch, cloud, identity):
    path = aws_project(orch, cloud, identity, "big", extra="workdir_max_mb: 0.5\n")
    (orch.tmp / "weights.bin").write_bytes(os.urandom(700_000))
    r = orch("launch", str(path))
    no_traceback(r)
    assert r.code == 2 and "weights.bin (0.7 MB)" in r.err and ".orchignore" in r.err, r.err
    assert cloud.instances("big") == [] and not any(cloud.leftovers("big").values())
