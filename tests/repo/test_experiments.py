"""Every file in experiments/ is a valid sweep, and the ones that need no cloud dry-run through the CLI."""

from __future__ import annotations

import pytest

from orchestrator.backends.registry import load_sweep
from tests.conftest import ROOT

EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_experiment_loads(path):
    sweep = load_sweep(path)
    assert sweep.runs and sweep.spec.name == path.stem


@pytest.mark.parametrize(
    "path", [p for p in EXPERIMENTS if load_sweep(p).spec.backend == "local"], ids=lambda p: p.name
)
def test_local_experiments_dry_run(orch, path):
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0 and "nothing launched" in r.out and "Traceback" not in r.err, r.out + r.err
    assert not (orch.home / "store").exists()  # a dry run creates nothing


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_aws_experiments_dry_run_on_the_fake_cloud(orch, cloud, identity):
    """Each AWS experiment, with the bucket and key filled in as its comments ask, dry-runs: its
    image resolves (after `orch ami build`), its instance types are priced or said to be unpriced,
    nothing is created (the only instance ever launched is the image's builder)."""
    import yaml

    from tests.e2e.aws.test_ami import recipe
    from tests.fakecloud import BUCKET

    # the experiments run on `image: recipe:orch-dl`: build one (a fake orch-dl, from the fake base image)
    built = orch("ami", "build", str(recipe(orch, identity, "orch-dl", ["true"])), timeout=300)
    assert built.code == 0, built.out + built.err
    for path in [p for p in EXPERIMENTS if load_sweep(p).spec.backend == "aws"]:
        spec = yaml.safe_load(path.read_text())
        spec["store"] = f"s3://{BUCKET}/sweeps"
        spec["aws"]["ssh"]["identity"] = str(identity)
        filled = orch.sweep(yaml.safe_dump(spec), name=path.name)
        r = orch("launch", str(filled), "--dry-run")
        assert r.code == 0 and "nothing launched" in r.out and "Traceback" not in r.err, (path.name, r.out + r.err)
        assert spec["aws"]["instance_types"][0] in r.out, (path.name, r.out)
        if spec["aws"]["image"] == "recipe:orch-dl":
            assert "image recipe:orch-dl: ami-" in r.out, r.out
        if path.name == "cifar10-8gpu.yaml":  # the shape per type, GPUs from DescribeInstanceTypes
            assert "choice p4d.24xlarge in" in r.out and "per node 8 GPU(s), 8 process(es)" in r.out, r.out
        if (
            path.name == "cifar10-pack.yaml"
        ):  # 8 one-GPU runs; the fake prices every type alike, so one 8-GPU instance is cheapest
            assert "packing: 8 runs of 1 GPU(s) per g6.48xlarge; max_parallel 8 -> 1 instance(s)" in r.out, r.out
            assert "then g6.12xlarge: 4 per instance, 2 instance(s)" in r.out, r.out
        if path.name == "imagenette.yaml":
            assert "g5.xlarge in" in r.out and "per node 1 GPU(s), 1 process(es)" in r.out, r.out
    assert [
        i["tags"]["orch:sweep"] for i in cloud.instances(states=("pending", "running", "stopped", "terminated"))
    ] == ["ami-orch-dl"]
