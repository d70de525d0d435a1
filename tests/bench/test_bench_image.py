"""Benchmark: time from `orch launch` (CreateFleet follows at once) to the first training step, on a
stock image that installs and downloads at every attempt, against an image built by `orch ami
build` with the data staged from S3 by `data:` — as a ratio, on the fake cloud with EC2-like boot
delays.

    scripts/test.sh -m bench -s -k image

The model (what cannot exist here, stated): sshd 75 s after `running` and 15 s more for the first
interpreter start (as in the acceptance test); on the stock image the command first spends
STOCK_SETUP_S seconds the way a real one would on `apt-get install tmux` + `pip install` (~30 s) and
downloading CIFAR-10 (170 MB at a modelled 20 MB/s from its server: ~8.5 s); on the baked image
nothing is installed and the data set (200 files, 20 MB) comes from S3 through `data:` (moto serves
it from memory on loopback, much faster than real S3). The ratio is only as good as that model; the
boot share is the fake cloud's, the staging share is measured.
"""

from __future__ import annotations

import os
import time

import pytest
import yaml

from orchestrator.wait import retry_until
from tests.conftest import ROOT
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET, FakeCloud, Strictness

pytestmark = [pytest.mark.bench, pytest.mark.slow]

STOCK_SETUP_S = 30 + 170 / 20  # apt + pip, then CIFAR-10 at 20 MB/s


@pytest.fixture
def ec2_like_cloud(tmp_path, orch):
    with FakeCloud(
        tmp_path / "cloud",
        boot_s=75,
        cold_s=15,
        strict=Strictness(instance_s=5, profile_s=10, group_s=3, pending_s=5, terminate_s=10),
    ) as c:
        orch.env.update(c.env())
        yield c


def first_step_s(orch, path, name) -> float:
    t0 = time.time()
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(
        lambda: status(orch, name).get("run", {}).get("metrics", {}).get("step", 0) >= 1,
        900,
        1.0,
        f"{name}'s first step",
    )
    took = time.time() - t0
    assert orch("down", name, timeout=600).code == 0
    return took


@pytest.mark.timeout(1800)
def test_bench_stock_image_and_downloads_vs_baked_image_and_staged_data(orch, ec2_like_cloud, identity, tmp_path):
    cloud = ec2_like_cloud
    s3 = cloud.client("s3")
    for i in range(200):
        s3.put_object(Bucket=BUCKET, Key=f"datasets/bench/f{i:03d}.bin", Body=os.urandom(100_000))
    from tests.e2e.aws.test_ami import recipe

    assert orch("ami", "build", str(recipe(orch, identity, "bench", ["true"])), timeout=900).code == 0

    def sweep(name, image, command, data=None):
        spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
        spec.update(name=name, store=f"s3://{BUCKET}/sweeps", command=command, grid=None)
        spec.pop("grid")
        spec["aws"].update(image=image, boot_timeout_s=300)
        spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
        if data:
            spec["data"] = data
        return orch.sweep(yaml.safe_dump(spec), name=f"{name}.yaml")

    train = "{python} -m trainer --preset digits --epochs 1 --log-every 1"
    stock = first_step_s(orch, sweep("stock", "orch-fake-ubuntu-gpu", f"sleep {STOCK_SETUP_S:.1f} && {train}"), "stock")
    baked = first_step_s(
        orch,
        sweep("baked", "recipe:bench", train, [{"from": f"s3://{BUCKET}/datasets/bench/", "to": "bench"}]),
        "baked",
    )
    print(
        f"\nlaunch -> first training step: stock image + installs/downloads {stock:.1f} s, "
        f"baked image + staged data {baked:.1f} s, ratio {stock / baked:.2f}"
    )
    assert stock > 0 and baked > 0
