"""The aws backend end to end through the CLI, on the fake cloud (moto + sshd hosts on loopback): a sweep with EC2's
boot times uses one instance per run, attach over ssh, host keys, bad settings, an interpreter without torch, and
`orch down` that waits for instances shutting down."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import uuid

import pytest
import yaml

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, ROOT, starts
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET, FakeCloud, Strictness
from tests.fakecloud.sweeps import smoke

pytestmark = pytest.mark.slow
SPENT = r"spent (\$[0-9]+\.[0-9]+)"  # a dollar figure as launch and collect print it


def s3_objects(cloud, prefix):
    s3 = cloud.client("s3")
    keys = [
        o["Key"]
        for p in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for o in p.get("Contents", [])
    ]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def smoke_sweep(orch, identity, name="fc", data=None):
    """experiments/fakecloud-smoke.yaml as the README runs it, with this test's key and user."""
    spec = yaml.safe_load((ROOT / "experiments" / "fakecloud-smoke.yaml").read_text())
    spec["name"] = name
    if data:
        spec["data"] = data
    spec["store"] = f"s3://{BUCKET}/sweeps"
    spec["aws"]["ssh"].update(identity=str(identity), user=os.environ.get("USER") or "root")
    return orch.sweep(yaml.safe_dump(spec))


@pytest.mark.timeout(700)
def test_sweep_runs_on_fake_spot_instances_and_leaves_nothing(orch, cloud, identity):
    # a data set outside the sweep's prefix: the instances may read it only through the profile orch made
    for name in ("a.txt", "sub/b.txt"):
        cloud.client("s3").put_object(Bucket=BUCKET, Key=f"datasets/tiny/{name}", Body=name.encode())
    path = smoke_sweep(orch, identity, data=[{"from": f"s3://{BUCKET}/datasets/tiny/", "to": "tiny"}])
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "g5.xlarge" in dry.out and "estimated" in dry.out, dry.out + dry.err
    r = orch("launch", str(path), timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "fc")
    assert sorted(final) == ["lr=0.05", "lr=0.1", "lr=0.2"]
    assert all(v["state"] == "succeeded" and v["attempt"] == 1 for v in final.values())

    objects = s3_objects(cloud, "sweeps/fc/")
    for run in final:
        base = f"sweeps/fc/{run}/"
        orch_base = f"sweeps/fc/.orch/{run}/"  # orch's own records, beside the run folder
        assert (
            base + "metrics.jsonl" in objects
            and orch_base + "logs/1.log" in objects
            and orch_base + "status.json" in objects
        )
        manifests = [k for k in objects if k.startswith(base + "ckpt/") and k.endswith("MANIFEST.json")]
        assert manifests, f"no checkpoint of {run} in S3"
        for m in manifests:  # every manifested checkpoint verifies against what S3 holds
            folder = m.rsplit("/", 1)[0]
            for name, meta in json.loads(objects[m])["files"].items():
                blob = objects[f"{folder}/{name}"]
                assert len(blob) == meta["size"] and hashlib.sha256(blob).hexdigest() == meta["sha256"]

    staged = sorted(orch.tmp.glob("cloud/hosts/*/home/orch/runs/.data/tiny/sub/b.txt"))
    assert len(staged) == 3 and all(p.read_text() == "sub/b.txt" for p in staged)  # on each host, before its run

    # every instance ended (the agents terminated their own hosts), after recording the safety net: `orch launch`
    # returns once none runs (control/ended.py; before, it could return just before the last TerminateInstances)
    assert cloud.instances("fc") == []
    retry_until(lambda: len(cloud.gone) == 3, 60, 0.1, "the hypervisor to let the 3 hosts go")  # at its next look
    from orchestrator.backends.aws.cloud.userdata import SAFETY_NET

    nets = [
        [f for f in yaml.safe_load(h.user_data.split("\n", 1)[1])["write_files"] if f["path"] == SAFETY_NET]
        for h in cloud.gone.values()
    ]
    assert all(len(n) == 1 and 'shutdown -h "+$left"' in n[0]["content"] for n in nets)  # at every boot
    # no AWS credential in user data, logs or anything else in the store
    assert all(cloud.secret not in h.user_data and "AWS_SECRET" not in h.user_data for h in cloud.gone.values())
    assert not [k for k, v in objects.items() if cloud.secret.encode() in v]

    col = orch("collect", "fc", "--out", str(orch.tmp / "res"))
    assert col.code == 0 and "lr=0.2" in col.out, col.err
    # the dollars a finished launch prints are the ones collect reads from the ledger afterwards
    launched, collected = re.findall(SPENT, r.out)[-1], re.findall(SPENT, col.out)[0]
    assert launched == collected, (launched, collected)
    assert (orch.tmp / "res" / "curves.png").exists()

    d = orch("down", "fc")
    assert d.code == 0, d.err
    assert cloud.leftovers("fc") == {
        "instances": [],
        "security_groups": [],
        "launch_templates": [],
        "instance_profiles": [],
    }
    assert orch("down", "fc").code == 0


def test_attach_shows_the_live_run_over_ssh(orch, cloud, identity, job):
    path = orch.sweep(cloud.sweep_yaml("fcattach", identity, job(steps=2, release=True), extra="max_restarts: 0"))
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(
        lambda: status(orch, "fcattach").get("run", {}).get("state") == "running",
        120,
        0.5,
        "the run to start on its instance",
    )
    outer = f"outer-{uuid.uuid4().hex[:6]}"
    try:
        subprocess.run(
            [
                "tmux",
                "-L",
                outer,
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "160",
                "-y",
                "40",
                " ".join(orch.argv("attach", "run")),
            ],
            env=orch.env,
            check=True,
        )

        def screen():
            return subprocess.run(
                ["tmux", "-L", outer, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True
            ).stdout

        retry_until(lambda: "tick" in screen(), 30, 0.3, "the trainer's output through ssh + tmux")
        # orch attach also takes the instance id, as users of the seed tooling expect
        iid = cloud.instances("fcattach")[0]["id"]
        subprocess.run(
            ["tmux", "-L", outer, "new-window", "-t", "t", " ".join(orch.argv("attach", iid))], env=orch.env, check=True
        )
        retry_until(
            lambda: (
                "tick"
                in subprocess.run(
                    ["tmux", "-L", outer, "capture-pane", "-p", "-t", "t:1"], capture_output=True, text=True
                ).stdout
            ),
            30,
            0.3,
            "attach by instance id",
        )
    finally:
        subprocess.run(["tmux", "-L", outer, "kill-server"], capture_output=True)
    job.release.touch()
    retry_until(
        lambda: status(orch, "fcattach", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 60, 0.5, "the run to finish"
    )
    assert len(starts(job.marks)) == 1
    assert orch("down", "fcattach").code == 0
    assert not any(cloud.leftovers("fcattach").values())


@pytest.mark.timeout(400)
def test_host_key_mismatch_refuses_and_terminates(orch, cloud, identity):
    cloud.wrong_host_keys = True
    path = orch.sweep(cloud.sweep_yaml("fckey", identity, "true", extra="max_restarts: 0"))
    r = orch("launch", str(path), timeout=300)
    assert r.code == 1
    final = status(orch, "fckey")["run"]
    assert final["state"] == "failed" and "host key" in final["reason"]
    assert cloud.instances("fckey") == []
    # the fake's hypervisor sees a terminated instance go at its next look (once a second)
    retry_until(lambda: len(cloud.gone) == 1, 30, 0.2, "the instance's host to go")
    orch("down", "fckey")


@pytest.mark.parametrize(
    "case, aws_fields, store, message",
    [
        ("no_bucket", {}, "s3://no-such-bucket/x", "bucket no-such-bucket does not exist"),
        ("no_ami", {"image": "ami-12345678"}, None, "aws.image: no image 'ami-12345678'"),
        ("no_subnet", {"subnet_ids": "[subnet-0123456789abcdef0]"}, None, "subnet not found"),
    ],
)
def test_bad_cloud_settings_fail_clearly_and_leave_nothing(orch, cloud, identity, case, aws_fields, store, message):
    text = cloud.sweep_yaml(f"fc{case.replace('_', '')}", identity, "true", **aws_fields)
    if store:
        text = text.replace(f"s3://{BUCKET}/sweeps", store)
    r = orch("launch", str(orch.sweep(text)))
    assert r.code != 0 and message in r.err and "Traceback" not in r.err, r.err
    assert not any(cloud.leftovers(f"fc{case.replace('_', '')}").values())


def test_missing_credentials(orch, cloud, identity):
    path = orch.sweep(cloud.sweep_yaml("fccreds", identity, "true"))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        orch.env.pop(k, None)
    orch.env.update(AWS_SHARED_CREDENTIALS_FILE=str(orch.tmp / "none"), AWS_CONFIG_FILE=str(orch.tmp / "none"))
    r = orch("launch", str(path))
    assert r.code != 0 and "No AWS credentials found" in r.err and "Traceback" not in r.err, r.err
    assert not any(cloud.leftovers("fccreds").values())


def test_the_dry_runs_cost_bound_bounds_the_dearest_choice(orch, cloud, identity):
    import re

    path = orch.sweep(cloud.sweep_yaml("bound", identity, "true", extra="grid:\n  a: [1, 2, 3]\ntimeout_minutes: 15"))
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.out + r.err
    prices = [float(p) for p in re.findall(r"choice \S+ in \S+: \$([0-9.]+)/h", r.out)]
    assert prices and min(prices) < max(prices), r.out  # g5 and g6 differ: the bound must take the dearer
    said = re.search(r"estimated cost at most \$([0-9.]+) ", r.out).group(1)
    # 3 runs of at most 15 minutes each at the dearest hour, which the dry run printed to 4 places (within $0.00005):
    # an upper bound rounds up, to the hundredth of a cent a sum under $1 is printed with
    least, most = (3 * 0.25 * (max(prices) + d) for d in (-0.00005, 0.00005))
    assert len(said.split(".")[1]) == 4 and least <= float(said) < most + 0.0001, r.out
    assert "15 min at the dearest spot price" in r.out, r.out


@pytest.fixture
def slow_cloud(tmp_path, orch):
    """EC2-like timing: sshd 75 s after `running`, 15 s more for the first interpreter start."""
    with FakeCloud(
        tmp_path / "cloud",
        boot_s=75,
        cold_s=15,
        strict=Strictness(instance_s=5, profile_s=10, group_s=3, pending_s=5, terminate_s=10),
    ) as c:
        orch.env.update(c.env())
        yield c
        assert not c.all_leftovers()


@pytest.mark.timeout(900)
def test_acceptance_three_runs_with_realistic_boot_use_exactly_three_instances(orch, slow_cloud, identity):
    """(a) start timeout from the agent's start, (b) instance profile on attempt 1, (e) NotFound, (g) interpreter."""
    path = smoke(orch, identity, "real", max_parallel=3)
    r = orch("launch", str(path), timeout=800)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    final = status(orch, "real")
    assert all(v["state"] == "succeeded" and v["attempt"] == 1 and v["preemptions"] == 0 for v in final.values()), final
    used = slow_cloud.instances("real", states=("pending", "running", "shutting-down", "terminated"))
    assert len(used) == 3, used  # one per run: no replacement loop
    assert slow_cloud.gate.counts["InvalidParameterValue"] > 0  # the new profile was refused at first, as on AWS
    assert slow_cloud.gate.counts["AccessDenied"] > 0  # hosts met S3's 403 for keys that do not exist yet
    d = orch("down", "real", timeout=600)
    assert d.code == 0, d.err
    assert not any(slow_cloud.leftovers("real").values())


@pytest.mark.timeout(400)
def test_g_an_interpreter_without_torch_stops_the_sweep_once_with_the_fix(orch, cloud, identity):
    path = smoke(orch, identity, "interp", aws_python="python3", max_parallel=1)
    r = orch("launch", str(path), timeout=300)
    assert r.code != 0 and "/opt/pytorch/bin/python" in r.err and "torch" in r.err and "Traceback" not in r.err, (
        r.out + r.err
    )
    used = cloud.instances("interp", states=("pending", "running", "shutting-down", "terminated"))
    assert len(used) == 1 and cloud.instances("interp") == []  # one host told us; it was terminated
    orch("down", "interp")


@pytest.mark.timeout(400)
def test_k_down_waits_for_shutting_down_instead_of_hammering_the_group(orch, tmp_path, identity):
    with FakeCloud(tmp_path / "c", strict=Strictness(terminate_s=8)) as cloud:
        orch.env.update(cloud.env())
        path = smoke(orch, identity, "slowdown", command="sleep 600", grid={"lr": [1]})
        assert orch("launch", str(path), "--detach").code == 0
        from orchestrator.wait import retry_until

        retry_until(
            lambda: status(orch, "slowdown").get("lr=1", {}).get("state") == "running", 120, 0.5, "the run to start"
        )
        d = orch("down", "slowdown", timeout=300)
        assert d.code == 0, d.out + d.err  # one go
        assert cloud.gate.counts["DependencyViolation"] == 0
        assert not any(cloud.leftovers("slowdown").values())
