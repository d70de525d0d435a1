"""`orch ami` on the fake cloud (moto serves CreateImage, DescribeImages, DeregisterImage, snapshots):
a recipe whose steps touch only the fake host's home is built, smoke-tested, tagged and listed, and its image
holds the builder's home without the key orch's user data authorized (an instance launched from it by another key
holder lets only that holder in); a second build reuses it; a sweep on `image: recipe:NAME` resolves to it;
`orch ami rm` removes it; a build whose step fails shows the step's output and leaves nothing behind. ami/provision.sh
passes `bash -n` and shellcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, make_identity
from tests.fakecloud import BUCKET

pytestmark = pytest.mark.slow


def recipe(orch, identity, name: str, steps, smoke: str = "") -> Path:
    spec = {
        "name": name,
        "aws": {
            "region": "us-east-1",
            "instance_types": ["g5.xlarge"],
            "image": "orch-fake-ubuntu-gpu",
            "image_owner": "self",
            "market": "spot-then-on-demand",
            "max_minutes": 30,
            "ssh_cidr": "127.0.0.1/32",
            "boot_timeout_s": 120,
            "ssh": {
                "user": os.environ.get("USER") or "root",
                "port": 2222,
                "address": "private_ip",
                "identity": str(identity),
            },
        },
        "files": {"hello.sh": "~/hello.sh"},
        "steps": steps,
    }
    if smoke:
        spec["smoke"] = smoke
    folder = orch.tmp / f"ami-{name}"
    folder.mkdir()
    (folder / "hello.sh").write_text("echo hello from the recipe > ~/hello.txt\n")
    (folder / "recipe.yaml").write_text(yaml.safe_dump(spec))
    return folder / "recipe.yaml"


def test_provision_script_is_valid_shell():
    script = ROOT / "ami" / "provision.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    r = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    from orchestrator.backends.aws.recipe import load_recipe

    spec, sha = load_recipe(ROOT / "ami" / "recipe.yaml")  # the default recipe validates, and its files exist
    assert spec.name == "orch-dl" and len(sha) == 64


@pytest.mark.timeout(700)
def test_build_list_use_and_remove_an_image(orch, cloud, identity):
    path = recipe(
        orch,
        identity,
        "tiny",
        ["bash ~/hello.sh", "cat ~/hello.txt"],
        smoke="test -s ~/hello.txt && python3 -c 'import trainer'",
    )
    cloud.gate.images.deregistered_s = 120.0  # the removed image stays listed while this test looks
    dry = orch("ami", "build", str(path), "--dry-run")
    assert dry.code == 0 and "not built yet" in dry.out and "nothing launched" in dry.out, dry.out + dry.err
    built = orch("ami", "build", str(path), timeout=600)
    assert built.code == 0, built.out + built.err
    assert "hello from the recipe" in built.out and "smoke" in built.out
    image_id = built.out.strip().splitlines()[-1].split()[1]
    assert image_id.startswith("ami-")
    ec2 = cloud.client("ec2")
    image = ec2.describe_images(ImageIds=[image_id])["Images"][0]
    tags = {t["Key"]: t["Value"] for t in image.get("Tags", [])}
    assert tags["orch:recipe"] == "tiny" and len(tags["orch:recipe-sha"]) == 64 and tags["orch:base"] == cloud.image
    assert cloud.instances(states=("pending", "running", "stopping", "stopped")) == []  # the builder is gone
    assert not any(cloud.leftovers("ami-tiny").values())

    again = orch("ami", "build", str(path))
    assert again.code == 0 and "already built" in again.out and image_id in again.out, again.out + again.err
    listed = orch("ami", "list", "--region", "us-east-1")
    assert listed.code == 0 and image_id in listed.out and "recipe tiny" in listed.out, listed.out

    # the image holds the builder's home (the fake's CreateImage snapshots it), without the key orch's user data put
    # in its ~/.ssh/authorized_keys: the laptop's key opens no instance launched from the image by anyone else
    laptop_key = identity.with_name("id_ed25519.pub").read_text().split()[1]
    baked = cloud.image_homes[image_id]
    assert (baked / "hello.txt").is_file() and (baked / ".ssh" / "authorized_keys").is_file()
    assert laptop_key not in (baked / ".ssh" / "authorized_keys").read_text()
    assert "removed orch's SSH key" in built.out

    sweep = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    sweep.update(name="onimage", store=f"s3://{BUCKET}/sweeps", command="test -s ~/hello.txt")  # the image's home
    sweep.pop("grid")
    sweep["aws"].update(image="recipe:tiny")
    colleague = make_identity(orch.tmp / "colleague", "colleague")  # another holder launches from the image
    sweep["aws"]["ssh"].update(identity=str(colleague), user=os.environ.get("USER") or "root")
    onimage = orch.sweep(yaml.safe_dump(sweep), name="onimage.yaml")
    dry = orch("launch", str(onimage), "--dry-run")
    assert dry.code == 0 and f"image recipe:tiny: {image_id}" in dry.out, dry.out + dry.err
    ran = orch("launch", str(onimage), timeout=300)
    assert ran.code == 0, ran.out + ran.err
    used = [
        i
        for r in ec2.describe_instances(Filters=[{"Name": "tag:orch:sweep", "Values": ["onimage"]}])["Reservations"]
        for i in r["Instances"]
    ]
    assert [i["ImageId"] for i in used] == [image_id]
    host = cloud.hosts.get(used[0]["InstanceId"]) or cloud.gone[used[0]["InstanceId"]]
    keys = host.authorized_keys.read_text()
    assert colleague.with_name("id_ed25519.pub").read_text().split()[1] in keys  # its own launch's key
    assert laptop_key not in keys, keys  # and not the builder's
    assert orch("down", "onimage").code == 0

    snapshots = [
        b["Ebs"]["SnapshotId"] for b in image.get("BlockDeviceMappings", []) if "SnapshotId" in b.get("Ebs", {})
    ]
    snap_tags = {
        t["Key"]: t["Value"] for s in ec2.describe_snapshots(SnapshotIds=snapshots)["Snapshots"] for t in s["Tags"]
    }
    assert snap_tags["orch:recipe"] == "tiny"  # tagged at creation, with the image
    gone = orch("ami", "rm", image_id, "--region", "us-east-1")
    assert gone.code == 0 and image_id in gone.out, gone.out + gone.err
    listed = ec2.describe_images(Owners=["self"], Filters=[{"Name": "tag-key", "Values": ["orch:recipe"]}])["Images"]
    assert [i["State"] for i in listed] == ["deregistered"]  # EC2 lists it "for a short interval"
    again = orch("ami", "rm", image_id, "--region", "us-east-1")  # just removed: already gone, not an error
    assert again.code == 0 and "already removed" in again.out, again.out + again.err
    assert image_id not in orch("ami", "list", "--region", "us-east-1").out
    left = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert not set(snapshots) & left
    missing = orch("launch", str(orch.tmp / "onimage.yaml"), "--dry-run")
    assert missing.code != 0 and "orch ami build" in missing.err and "Traceback" not in missing.err, (
        missing.out + missing.err
    )


@pytest.mark.timeout(700)
def test_a_failing_step_shows_its_output_and_leaves_nothing(orch, cloud, identity):
    path = recipe(orch, identity, "broken", ["bash ~/hello.sh", "echo about to fail; exit 3", "echo never"])
    r = orch("ami", "build", str(path), timeout=600)
    assert (
        r.code != 0 and "step 2/3 failed (exit 3)" in r.err and "about to fail" in r.err and "Traceback" not in r.err
    ), r.out + r.err
    assert "never" not in r.out
    assert cloud.instances(states=("pending", "running", "stopping", "stopped")) == []
    assert not any(cloud.leftovers("ami-broken").values())
    assert (
        cloud.client("ec2").describe_images(Owners=["self"], Filters=[{"Name": "tag-key", "Values": ["orch:recipe"]}])[
            "Images"
        ]
        == []
    )


@pytest.mark.timeout(700)
@pytest.mark.parametrize("state", ["failed", "error"])
def test_a_failed_image_is_an_error_and_stays_listed_for_rm(orch, cloud, identity, state):
    """Every bad terminal ImageState ends the build at once with EC2's reason (not after the 3 h wait), the builder
    terminated; the image, tagged at creation, stays listed for `orch ami rm`."""
    # market spot: the builder is a one-time spot instance, which EC2 (and the fake) refuses to stop
    path = recipe(orch, identity, "flaky", ["true"])
    spec = yaml.safe_load(path.read_text())
    spec["aws"]["market"] = "spot"
    path.write_text(yaml.safe_dump(spec))
    cloud.gate.images.end_state = state
    r = orch("ami", "build", str(path), timeout=600)
    assert r.code != 0 and f"is {state}" in r.err and "orch ami rm" in r.err and "Traceback" not in r.err, r.out + r.err
    assert "injected by the fake cloud" in r.err  # its StateReason
    assert cloud.gate.counts["UnsupportedOperation"] == 0  # nothing tried to stop the spot builder
    (image,) = [
        i
        for i in cloud.client("ec2").describe_images(Owners=["self"])["Images"]
        if any(t["Key"] == "orch:recipe" and t["Value"] == "flaky" for t in i.get("Tags", []))
    ]
    assert image["State"] == state
    listed = orch("ami", "list", "--region", "us-east-1")
    assert image["ImageId"] in listed.out and state in listed.out, listed.out
    dry = orch.sweep(
        yaml.safe_dump(
            {
                "name": "onflaky",
                "backend": "aws",
                "store": f"s3://{BUCKET}/s",
                "command": "true",
                "aws": {**spec["aws"], "image": "recipe:flaky"},
            }
        ),
        name="onflaky.yaml",
    )
    refused = orch("launch", str(dry), "--dry-run")
    assert refused.code != 0 and "no image built from recipe 'flaky'" in refused.err, (
        refused.out + refused.err
    )  # never a failed one
    assert orch("ami", "rm", image["ImageId"], "--region", "us-east-1").code == 0
    assert cloud.instances(states=("pending", "running", "stopping", "stopped")) == []


def test_the_controller_runs_under_the_documented_policy_only(cloud):
    from botocore.exceptions import ClientError

    from orchestrator.backends.aws.cloud import ec2 as api

    ec2 = api.client("ec2", "us-east-1")  # the controller's credentials, as every orch command has them
    assert ec2.describe_images(Owners=["self"])["Images"]  # in the policy
    with pytest.raises(ClientError, match="UnauthorizedOperation"):  # not in it: orch never stops an instance
        ec2.stop_instances(InstanceIds=["i-0123456789abcdef0"])
    assert cloud.gate.denied == ["ec2:StopInstances"]
    cloud.gate.denied.clear()


def test_sigterm_mid_build_cleans_up_like_ctrl_c(orch, cloud, identity):
    import signal

    path = recipe(orch, identity, "slow", ["echo started; sleep 600"])
    p = orch.popen("ami", "build", str(path))
    lines = []
    for line in p.stdout:  # the step is running on the builder
        lines.append(line)
        if "started" in line:
            break
    p.send_signal(signal.SIGTERM)
    out = "".join(lines) + p.communicate(timeout=280)[0]
    assert p.returncode == 130 and "interrupted" in out and "Traceback" not in out, out
    assert cloud.instances(states=("pending", "running", "stopping", "stopped")) == []
    assert not any(cloud.leftovers("ami-slow").values())
    assert "nothing of ami-slow" in orch("down", "ami-slow").out


def test_ami_inputs_that_cannot_work_are_clear_errors(orch, cloud, identity):
    bad = orch.tmp / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    r = orch("ami", "build", str(bad), "--dry-run")
    assert r.code == 2 and "not UTF-8" in r.err and "Traceback" not in r.err, r.err
    r = orch("ami", "rm", "not-an-id", "--region", "us-east-1")
    assert r.code == 2 and "not an image id" in r.err, r.err
    r = orch("ami", "rm", "ami-0123456789abcdef0", "--region", "us-east-1")
    assert r.code == 1 and "does not exist" in r.err and "Traceback" not in r.err, r.err
    (orch.tmp / "ds").mkdir()
    (orch.tmp / "ds" / "f.txt").write_text("x")
    r = orch("data", "push", str(orch.tmp / "ds"), "s3://no-such-bucket-here/datasets/x/")
    assert r.code == 2 and "no-such-bucket-here" in r.err and "store:" not in r.err and "Traceback" not in r.err, r.err
