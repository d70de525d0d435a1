"""`orch launch --remote` on the fake cloud: the controller on an instance of its own, the laptop asleep."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, fake_cloud, starts
from tests.conftest import run_states as status
from tests.fakecloud import BUCKET, IMAGE_NAME, processes_of
from tests.fakecloud.gate import CONTROLLER_KEY

pytestmark = pytest.mark.slow

CONTROLLER = f"{{image: {IMAGE_NAME}, image_owner: self, python: python3, max_hours: 2}}"


def remote_sweep(orch, cloud, identity, job, name: str, extra: str = "max_restarts: 0"):
    return orch.sweep(cloud.sweep_yaml(name, identity, job(steps=3, release=True), extra=extra, controller=CONTROLLER))


def controller_ids(cloud, sweep: str, states=("pending", "running")):
    return [i["id"] for i in cloud.instances(sweep, states) if i["tags"].get("orch:role") == "controller"]


def run_instance(cloud, sweep: str, run: str, attempt: int) -> str:
    found = [
        i["id"]
        for i in cloud.instances(sweep)
        if i["tags"].get("orch:run") == run and i["tags"].get("orch:attempt") == str(attempt)
    ]
    return found[0] if found else ""


def laptop_controllers(home: Path) -> list:
    """orch processes of this ORCH_HOME outside every fake instance: the laptop's own."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"orchestrator.cli" in cmd and f"ORCH_HOME={home}".encode() in env:
            if not any(e.startswith(b"ORCH_FAKE_HOST=") for e in env):
                found.append(cmd.decode(errors="replace"))
    return found


def everything_of(root: Path) -> bytes:
    out = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                out.append(p.read_bytes())
        except OSError:
            pass
    return b"\n".join(out)


@pytest.mark.timeout(1200)
def test_remote_controller_resumes_an_interrupted_run_while_the_laptop_sleeps_and_ends_itself(
    orch, cloud, identity, job
):
    path = remote_sweep(orch, cloud, identity, job, "away")
    assert not cloud.gate.service_roles  # an account that never launched spot: its controller's role may not make it
    dry = orch("launch", str(path), "--dry-run", "--remote")
    assert dry.code == 0 and "controller: t3.micro on demand at $0.0104/h" in dry.out, dry.out + dry.err

    r = orch("launch", str(path), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    assert "orch logs --controller away" in r.out and "orch down away" in r.out, r.out
    [ctl] = controller_ids(cloud, "away")
    assert ctl in r.out
    assert laptop_controllers(orch.home) == []  # nothing of the laptop runs from here on

    st = json.loads(orch("status", "away", "--json").out)
    assert st["controller"]["holder"]["instance_id"] == ctl and st["controller"]["alive"], st["controller"]
    plain = orch("status", "away")
    assert f"instance {ctl} (t3.micro, us-east-1)" in plain.out, plain.out

    retry_until(lambda: run_instance(cloud, "away", "run", 1), 120, 0.5, "the run's first instance")
    retry_until(lambda: status(orch, "away").get("run", {}).get("state") == "running", 120, 0.5, "the run to start")
    first = run_instance(cloud, "away", "run", 1)
    cloud.spot_notice(first)  # the spot market, while nothing of the laptop runs
    retry_until(
        lambda: (v := status(orch, "away")["run"])["preemptions"] >= 1 or v["attempt"] >= 2,
        120,
        0.5,
        "the agent to record the interruption",
    )
    cloud.reclaim(first)
    retry_until(lambda: run_instance(cloud, "away", "run", 2), 180, 0.5, "the remote controller's second attempt")
    assert laptop_controllers(orch.home) == []
    retry_until(
        lambda: (v := status(orch, "away")["run"])["state"] == "running" and v["attempt"] == 2,
        180,
        0.5,
        "the resumed attempt",
    )
    # the laptop's key reaches the remote controller's hosts too (`orch attach`): it is among their keys
    host = cloud.hosts[run_instance(cloud, "away", "run", 2)]
    keys = host.authorized_keys.read_text()
    assert identity.with_name("id_ed25519.pub").read_text().split()[1] in keys and "orch-controller" in keys
    env = [(Path(f"/proc/{p}/environ").read_bytes()) for p in processes_of(ctl)]
    assert env and not any(CONTROLLER_KEY.encode() in e or cloud.secret.encode() in e for e in env)

    job.release.touch()
    retry_until(
        lambda: status(orch, "away", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 180, 0.5, "the run to finish"
    )
    retry_until(lambda: not controller_ids(cloud, "away"), 120, 0.5, "the controller to terminate its own instance")
    assert [s[1] for s in starts(job.marks)] == ["1", "2"]  # (the reclaim killed attempt 1: its lock stays behind)
    # `workdir:` (this test's folder) as the laptop's launch took it reached the remote controller's hosts, through
    # the store: both attempts ran that snapshot, unpacked on each instance
    s3 = cloud.client("s3")
    digest = json.loads(s3.get_object(Bucket=BUCKET, Key="sweeps/away/sweep.json")["Body"].read())["code"]["digest"]
    run_record = json.loads(s3.get_object(Bucket=BUCKET, Key="sweeps/away/.orch/run/status.json")["Body"].read())
    assert run_record["code"] == digest
    assert len(list(cloud.root.glob(f"hosts/*/home/orch/runs/.code/{digest}/job.py"))) == 2

    st = json.loads(orch("status", "away", "--json").out)
    assert st["controller"]["ended"] and st["controller"]["end_reason"] == "every run is final", st["controller"]
    log = orch("logs", "--controller", "away")
    assert log.code == 0 and "terminating this instance" in log.out, log.out + log.err

    # the laptop's credentials and private key appear nowhere on the controller's host
    gone = cloud.gone_host(ctl)
    private = identity.read_text().strip().splitlines()[3]  # (the first lines are the same in every ed25519 key)
    for secret in (cloud.secret, CONTROLLER_KEY, private):
        assert secret not in gone.user_data
        assert secret.encode() not in everything_of(gone.root), secret
    assert not [d for d in cloud.gate.role_denied if d[0].endswith(".controller")], cloud.gate.role_denied
    # the laptop made the spot service-linked role before the controller's first spot request needed it
    assert "AWSServiceRoleForEC2Spot" in cloud.gate.service_roles
    assert not cloud.gate.counts["AuthFailure.ServiceLinkedRoleCreationNotPermitted"]

    col = orch("collect", "away", "--out", str(orch.tmp / "res"))
    assert col.code == 0 and "controller: $" in col.out, col.out + col.err

    d = orch("down", "away")
    assert d.code == 0, d.err
    assert not any(cloud.leftovers("away").values()), cloud.leftovers("away")


@pytest.mark.timeout(900)
def test_a_second_remote_launch_adopts_and_down_stops_the_remote_controller(orch, cloud, identity, job):
    path = remote_sweep(orch, cloud, identity, job, "twice")
    assert orch("launch", str(path), "--remote", timeout=600).code == 0
    [ctl] = controller_ids(cloud, "twice")
    again = orch("launch", str(path), "--remote")
    assert again.code == 0 and "Adopted" in again.out and ctl in again.out, again.out + again.err
    assert controller_ids(cloud, "twice") == [ctl]
    local = orch("launch", str(path), "--detach")
    assert local.code == 2 and ctl in local.err and "orch down twice" in local.err, local.out + local.err

    d = orch("down", "twice")
    assert d.code == 0 and f"stopped the controller on instance {ctl}" in d.out, d.out + d.err
    assert not any(cloud.leftovers("twice").values()), cloud.leftovers("twice")
    assert not controller_ids(cloud, "twice", ("pending", "running", "stopping", "stopped", "shutting-down"))


@pytest.mark.timeout(900)
def test_a_controller_instance_slow_to_answer_its_first_metadata_request_still_runs_the_sweep(
    orch, cloud, identity, job
):
    """The remote controller's credentials come from its instance's IMDS, which botocore asks once with 1 s to answer
    by default. Every host here, the controller's among them, answers its first token request 1.5 s late. Seen
    without the fix: the supervisor died at its first store read ("No AWS credentials found"), the controller it had
    started ran the sweep to its end, and nothing terminated the instance (it would have billed until max_hours)."""
    cloud.imds_late_s = 1.5
    path = remote_sweep(orch, cloud, identity, job, "late")
    r = orch("launch", str(path), "--remote", timeout=600)
    assert r.code == 0, r.out[-3000:] + r.err[-3000:]
    [ctl] = controller_ids(cloud, "late")
    job.release.touch()
    retry_until(
        lambda: status(orch, "late", gap=ENDED_GAP_S).get("run", {}).get("state") == "succeeded",
        300,
        0.5,
        "the run to finish",
    )
    assert status(orch, "late")["run"]["attempt"] == 1
    retry_until(lambda: not controller_ids(cloud, "late"), 120, 0.5, "the controller to terminate its own instance")
    assert cloud.gone_host(ctl).imds_answered  # the late answer was given
    d = orch("down", "late")
    assert d.code == 0, d.out + d.err
    assert not any(cloud.leftovers("late").values()), cloud.leftovers("late")


def test_remote_needs_the_aws_backend(orch, tmp_path):
    path = orch.sweep('name: here\nbackend: local\ncommand: "true"\n')
    r = orch("launch", str(path), "--remote")
    assert r.code == 2 and "backend: aws" in r.err and "Traceback" not in r.err, r.err
    assert not os.path.exists(orch.home / "locks")


@pytest.mark.timeout(1200)
def test_a_lost_controller_instance_is_reported_and_a_second_remote_adopts_the_runs(orch, cloud, identity, job):
    path = remote_sweep(orch, cloud, identity, job, "lost")
    assert orch("launch", str(path), "--remote", timeout=600).code == 0
    [ctl] = controller_ids(cloud, "lost")
    retry_until(lambda: status(orch, "lost").get("run", {}).get("state") == "running", 180, 0.5, "the run to start")
    run_host = run_instance(cloud, "lost", "run", 1)
    cloud.reclaim(ctl)  # the controller's instance goes without a word; its run goes on

    def says_gone() -> str:
        out = orch("status", "lost").out
        return out if "is gone" in out else ""

    # the lease lapses 120 s after the last heartbeat (lease.STALE_S): asked every 8 s, not 60 CLI calls of ~1 s of CPU
    out = retry_until(says_gone, 300, 8.0, "orch status to say the controller is gone")
    assert ctl in out and f"orch launch {path}" in out, out
    again = orch("launch", str(path), "--remote", timeout=600)
    assert again.code == 0, again.out[-3000:] + again.err[-3000:]
    [new] = controller_ids(cloud, "lost")
    assert new != ctl and run_instance(cloud, "lost", "run", 1) == run_host  # adopted, not started again
    job.release.touch()
    retry_until(
        lambda: status(orch, "lost", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 300, 0.5, "the run to finish"
    )
    assert [s[1] for s in starts(job.marks)] == ["1"] and not (job.marks / "DUPLICATE").exists()
    retry_until(lambda: not controller_ids(cloud, "lost"), 180, 0.5, "the new controller to terminate itself")
    assert orch("down", "lost").code == 0
    assert not any(cloud.leftovers("lost").values()), cloud.leftovers("lost")


@pytest.mark.timeout(1200)
def test_a_crashed_remote_controller_is_restarted_by_its_supervisor_and_takes_its_own_lease_at_once(
    orch, cloud, identity, job
):
    path = remote_sweep(orch, cloud, identity, job, "phoenix")
    assert orch("launch", str(path), "--remote", timeout=600).code == 0
    [ctl] = controller_ids(cloud, "phoenix")
    retry_until(lambda: status(orch, "phoenix").get("run", {}).get("state") == "running", 180, 0.5, "the run to start")

    def controller_pid() -> int:
        for pid in processes_of(ctl):
            try:
                if b"_controller" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        return 0

    first = controller_pid()
    assert first
    os.kill(first, 9)  # an out-of-memory kill: its lease stays fresh in the store, held by a process now gone
    retry_until(lambda: controller_pid() not in (0, first), 120, 0.5, "the supervisor to start the controller again")

    def taken() -> str:
        out = orch("logs", "--controller", "phoenix").out  # (the supervisor uploads it every 10 s)
        return out if "took the sweep over" in out else ""

    log = retry_until(taken, 120, 2.0, "the restarted controller to take the sweep")
    assert "already run by a controller" not in log and "restart 1 of" in log, log[-3000:]
    assert controller_ids(cloud, "phoenix") == [ctl]  # the same instance goes on
    job.release.touch()
    retry_until(
        lambda: status(orch, "phoenix", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 300, 0.5, "the run to finish"
    )
    retry_until(lambda: not controller_ids(cloud, "phoenix"), 180, 0.5, "the controller to terminate itself")
    assert [s[1] for s in starts(job.marks)] == ["1"]  # adopted by the restarted controller, never run twice
    assert orch("down", "phoenix").code == 0
    assert not any(cloud.leftovers("phoenix").values()), cloud.leftovers("phoenix")


@pytest.mark.timeout(900)
def test_the_controller_terminates_its_own_instance_at_max_hours(orch, cloud, identity, job):
    path = orch.sweep(
        cloud.sweep_yaml(
            "short",
            identity,
            job(steps=3, release=True),
            extra="max_restarts: 0",
            controller=f"{{image: {IMAGE_NAME}, image_owner: self, python: python3, max_hours: 0.03}}",
        )
    )
    assert orch("launch", str(path), "--remote", timeout=600).code == 0
    retry_until(lambda: not controller_ids(cloud, "short"), 400, 1.0, "the controller to end itself at max_hours")
    log = orch("logs", "--controller", "short").out
    assert "max_hours reached" in log and "terminating this instance" in log, log[-2000:]
    assert status(orch, "short")["run"]["state"] != "succeeded"  # the run never finished: the net ended it
    assert orch("down", "short").code == 0
    assert not any(cloud.leftovers("short").values()), cloud.leftovers("short")


@pytest.mark.timeout(1200)
def test_two_remote_launches_racing_leave_one_controller_and_run_each_run_once(orch, cloud, identity, job):
    path = remote_sweep(orch, cloud, identity, job, "race")
    racers = [orch.popen("launch", str(path), "--remote") for _ in range(2)]
    outs = [p.communicate(timeout=900)[0] for p in racers]
    assert [p.returncode for p in racers] == [0, 0], outs
    assert sum("Adopted" in out for out in outs) == 1, outs  # one started the controller, the other adopted it
    # the loser's instance, if it bought one, is terminated by the loser (or by its own refused controller)
    [ctl] = retry_until(
        lambda: len(controller_ids(cloud, "race")) == 1 and controller_ids(cloud, "race"), 300, 1.0, "one controller"
    )
    assert ctl in orch("status", "race").out  # the one that holds the sweep
    retry_until(lambda: status(orch, "race").get("run", {}).get("state") == "running", 180, 0.5, "the run to start")
    job.release.touch()
    retry_until(
        lambda: status(orch, "race", gap=ENDED_GAP_S).get("run", {}).get("state") == "succeeded",
        300,
        1.0,
        "the run to end",
    )
    assert [s[1] for s in starts(job.marks)] == ["1"] and not (job.marks / "DUPLICATE").exists()
    d = orch("down", "race")
    assert d.code == 0, d.out + d.err
    assert not any(cloud.leftovers("race").values()), cloud.leftovers("race")
    assert not controller_ids(cloud, "race", ("pending", "running", "stopping", "stopped"))


@pytest.fixture(params=["pending", "booting"])
def booting_cloud(request, tmp_path, orch):
    """A fake cloud whose new instances stay `pending` (or, running, keep their sshd down) for minutes, as EC2's can:
    `orch down` reaches the controller's instance while the launch waits for it to run (or to answer)."""
    from tests.fakecloud.gate import Strictness

    slow = {"pending": {"strict": Strictness(pending_s=300)}, "booting": {"boot_s": 300}}[request.param]
    with fake_cloud(tmp_path, orch, **slow) as c:
        yield request.param, c


@pytest.mark.timeout(600)
def test_down_during_a_remote_launch_ends_the_launch_with_143(orch, booting_cloud, identity, job):
    """`orch down` while `orch launch --remote` waits for its controller's instance to run, or for its sshd: the
    launch exits 143 at once, as any launch `orch down` stops does, and says so; nothing of the sweep is left. (Before,
    it waited out `aws.boot_timeout_s`, 600 s, for an instance that had ended.)"""
    stage, cloud = booting_cloud
    path = remote_sweep(orch, cloud, identity, job, "downed")
    launch = orch.popen("launch", str(path), "--remote")
    states = ("pending",) if stage == "pending" else ("running",)
    retry_until(lambda: controller_ids(cloud, "downed", states), 200, 0.05, f"the controller's instance {states}")
    down = orch("down", "downed")
    assert down.code == 0, down.out + down.err
    out, _ = launch.communicate(timeout=120)  # not the 600 s boot allowance, nor the 300 s wait for a first pass
    assert launch.returncode == 143 and "stopped by `orch down downed`" in out, (launch.returncode, out[-3000:])
    assert "Traceback" not in out, out
    assert orch("down", "downed").code == 0  # whatever the launch made after the first down listed the instances
    assert not cloud.instances("downed") and not any(cloud.leftovers("downed").values())
