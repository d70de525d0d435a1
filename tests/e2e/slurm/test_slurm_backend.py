"""`backend: slurm` end to end through `orch launch`, against a real slurmctld and two slurmd on loopback: each run a
job, Slurm's own interruptions (requeue, a time limit, a node set DOWN) resumed from the newest checkpoint, and
`orch down` leaving nothing in the queue."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.wait import retry_until
from tests.conftest import command_processes, held, no_traceback, starts
from tests.conftest import run_states as status

pytestmark = pytest.mark.slow


def test_a_three_run_sweep_runs_as_three_jobs(orch, cluster, slurm_section, job):
    path = orch.sweep(
        f'name: cl\ncommand: "{job(steps=5)}"\nworkdir: null\nstore: store\nmax_parallel: 3\n'
        f"grid:\n  lr: [1, 2, 3]\n{slurm_section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    runs = status(orch, "cl")
    assert len(runs) == 3 and {v["state"] for v in runs.values()} == {"succeeded"}, runs
    names = {j["name"] for j in cluster.jobs()}
    assert len([n for n in names if n.startswith("orch_cl_")]) == 3, names
    assert not (job.marks / "DUPLICATE").exists()
    assert "tick 4" in orch("logs", next(iter(runs))).out
    r = orch("collect", "cl")
    assert r.code == 0 and "GPU-h" in r.out, r.out
    assert not cluster.queued()


def _job_of(cluster, sweep: str, attempt: int = 1) -> dict:
    return retry_until(
        lambda: next(
            (j for j in cluster.jobs() if j["name"].endswith(f".a{attempt}") and j["name"].startswith(f"orch_{sweep}_")
             and j["state"] == "RUNNING"),
            None,
        ),
        120,
        0.2,
        f"attempt {attempt}'s job running",
    )  # fmt: skip


def _pending(pid: int, sig: int) -> bool:
    """Whether `sig` waits to be delivered to process `pid` (a stopped process keeps what it is sent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (sig - 1)) for mask in masks)


def _resumed(orch, cluster, tmp_path, sweep: str, hurt, extra: str = "") -> dict:
    """A trainer run, hurt through Slurm once a checkpoint is in the store: it ends with the weights of a run never
    interrupted, in a later attempt, with no failure counted."""
    from tests.e2e.local.test_spot import LONGER, TRAIN
    from tests.unit.trainer.test_train import final_weights, run_trainer, same

    reference = tmp_path / "reference"
    run_trainer([*LONGER, "--out", str(reference)])
    path = orch.sweep(f'name: {sweep}\ncommand: "{TRAIN}"\nworkdir: null\nstore: store\nmax_restarts: 0\n{extra}')
    assert orch("launch", str(path), "--detach").code == 0
    ckpts = orch.store(sweep, "run")

    def stored():
        assert status(orch, sweep).get("run", {}).get("state") != "failed", status(orch, sweep)
        return list(ckpts.glob("ckpt/*/MANIFEST.json"))

    retry_until(stored, 240, 0.2, "a checkpoint in the store")
    hurt(_job_of(cluster, sweep))
    retry_until(
        lambda: status(orch, sweep).get("run", {}).get("state") in ("succeeded", "failed"), 300, 1, "the run's end"
    )
    final = status(orch, sweep)["run"]
    assert final["state"] == "succeeded" and final["attempt"] >= 2 and final["failures"] == 0, final
    assert "resumed from" in orch("logs", "run", "--attempt", str(final["attempt"])).out
    assert same(final_weights(reference), final_weights(ckpts))
    retry_until(lambda: not cluster.queued(), 60, 0.5, "the queue empty")
    return final


@pytest.mark.timeout(600)
def test_a_job_requeued_by_scontrol_resumes_from_its_checkpoint(orch, cluster, slurm_section, tmp_path):
    def requeue(job):
        # The trainer waits (SIGSTOP) from before the requeue until Slurm's SIGTERM, passed on by its agent, waits for
        # it: the moment is an event. Without the hold a run at full speed ended 4 s after `scontrol requeue`, before
        # the signal reached it (seen in a fresh-clone run), and never checkpointed on it.
        trainer = command_processes(tmp_path / "runs" / "requeued" / "run" / "ctl")
        assert trainer, "the command's pid file"
        with held(trainer):
            assert cluster.run("scontrol", "requeue", job["id"]).returncode == 0
            retry_until(lambda: any(_pending(pid, signal.SIGTERM) for pid in trainer), 120, 0.1, "the SIGTERM")

    _resumed(orch, cluster, tmp_path, "requeued", requeue, slurm_section())
    r = orch("status", "requeued")
    assert r.code == 0, r.err
    # Slurm's SIGTERM (KillWait before its SIGKILL): the trainer checkpointed on it, and the agent kept what it wrote
    # (its log to the end, the checkpoint) as on orch's own stop
    assert "SIGTERM: checkpointed at step" in orch("logs", "run", "--attempt", "1").out


COUNTER = """
import glob, json, os, signal, sys, time
folder, total = os.environ["ORCH_RUN_DIR"], int(sys.argv[1])
done = [int(p.split(os.sep)[-2]) for p in glob.glob(os.path.join(folder, "ckpt", "*", "MANIFEST.json"))]
n = max(done, default=0)
print(f"resumed from step {n}" if n else "from the start", flush=True)
def save(*_):
    os.makedirs(os.path.join(folder, "ckpt", str(n)), exist_ok=True)
    with open(os.path.join(folder, "ckpt", str(n), "MANIFEST.json"), "w") as f:
        json.dump({"step": n}, f)
def bye(*_):
    sys.exit(143)
signal.signal(signal.SIGUSR1, save)
signal.signal(signal.SIGTERM, bye)
while n < total:
    time.sleep(0.5)
    n += 1
    with open(os.path.join(folder, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": n}) + "\\n")
    if n % 10 == 0:
        save()
print("done at", n, flush=True)
"""


@pytest.mark.timeout(600)
def test_a_run_longer_than_the_time_limit_finishes_across_jobs(orch, cluster, slurm_section, script):
    """The partition `short` gives each job one minute: Slurm tells the job to checkpoint (USR1, `warn_s` before its
    end: at slurmctld's first time-limit check, within 30 s), and the run, 35 s of work, goes on in a new job from
    where it was."""
    counter = script(COUNTER, "counter.py")
    path = orch.sweep(
        f'name: limited\ncommand: "{{python}} {counter} 70"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"{slurm_section(partition='short', warn_s=59)}"
    )
    r = orch("launch", str(path), timeout=290)
    assert r.code == 0, r.out + r.err
    final = status(orch, "limited")["run"]
    assert final["state"] == "succeeded" and final["attempt"] >= 2 and final["failures"] == 0, final
    assert orch.store("limited", "run", "metrics.jsonl").read_text().splitlines()[-1] == '{"step": 70}'
    assert "done at" not in orch("logs", "run", "--attempt", "1").out  # told before its end, it stopped there
    assert "resumed from step" in orch("logs", "run", "--attempt", str(final["attempt"])).out
    jobs = [j for j in cluster.jobs() if j["name"].startswith("orch_limited_")]
    assert len(jobs) >= 2, jobs
    retry_until(lambda: not cluster.queued(), 60, 0.5, "the queue empty")  # (the last job's script ends after its run)


@pytest.mark.timeout(300)
def test_a_node_set_down_mid_run_resumes_on_the_other(orch, cluster, slurm_section, script):
    """`scontrol update NodeName=... State=DOWN` kills the job on it: the run resumes on the other node from its
    newest checkpoint (the counter's: the trainer's weights are checked by the requeue test)."""
    counter = script(COUNTER, "counter.py")
    path = orch.sweep(
        f'name: downed\ncommand: "{{python}} {counter} 40"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"{slurm_section()}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: list(orch.store("downed", "run").glob("ckpt/*/MANIFEST.json")), 120, 0.2, "a checkpoint")
    job = _job_of(cluster, "downed")
    r = cluster.run("scontrol", "update", f"NodeName={job['nodes']}", "State=DOWN", "Reason=orch-test")
    assert r.returncode == 0, r.stderr
    retry_until(lambda: status(orch, "downed").get("run", {}).get("state") in ("succeeded", "failed"), 120, 1, "end")
    final = status(orch, "downed")["run"]
    assert final["state"] == "succeeded" and final["attempt"] >= 2 and final["failures"] == 0, final
    assert "resumed from step" in orch("logs", "run", "--attempt", str(final["attempt"])).out
    assert orch.store("downed", "run", "metrics.jsonl").read_text().splitlines()[-1] == '{"step": 40}'
    last = [j for j in cluster.jobs() if j["name"].startswith("orch_downed_") and j["state"] == "COMPLETED"]
    assert last and all(j["nodes"] != job["nodes"] for j in last), (last, job)


def test_orch_down_empties_the_queue_and_status_shows_why_a_job_waits(orch, cluster, slurm_section, job):
    path = orch.sweep(
        f'name: downq\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 3\n'
        f"grid:\n  lr: [1, 2, 3]\n{slurm_section(sbatch='[--cpus-per-task=2]')}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: len(starts(job.marks)) == 2, 120, 0.2, "two runs started (the cluster holds two)")
    waiting = retry_until(
        lambda: (lambda out: out if "pending (Resources)" in out else None)(orch("status", "downq").out),
        60,
        0.5,
        "the third job pending in `orch status`",
    )
    assert "job " in waiting, waiting
    r = orch("down", "downq")
    assert r.code == 0, r.out + r.err
    assert not cluster.queued(), cluster.jobs()
    runs = status(orch, "downq")
    assert {v["state"] for v in runs.values()} <= {"stopped", "queued"}, runs


def test_an_unknown_partition_is_refused_in_slurms_words_at_its_line(orch, cluster, slurm_section, job):
    path = orch.sweep(
        f'name: badp\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\n{slurm_section(partition="gpuz")}'
    )
    r = orch("launch", str(path))
    assert r.code == 2, r.out + r.err
    no_traceback(r)
    assert f"{path}:" in r.err and "slurm.partition" in r.err and "partition" in r.err.lower(), r.err
    assert "sinfo" in r.err, r.err  # the fix
    assert not cluster.jobs() and not starts(job.marks)


def test_a_malformed_time_is_refused_before_slurm_is_asked(orch, cluster, slurm_section, job):
    path = orch.sweep(
        f'name: badt\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\n{slurm_section(time="90 minutes")}'
    )
    r = orch("launch", str(path))
    assert r.code == 2, r.out + r.err
    no_traceback(r)
    assert f"{path}:" in r.err and "slurm.time" in r.err and "H:MM:SS" in r.err, r.err
    assert not cluster.jobs()


@pytest.fixture
def login(cluster, tmp_path):
    """A login node: a real sshd on loopback whose shell has Slurm's commands pointed at the cluster."""
    from tests.fakessh import SshHosts

    with SshHosts(tmp_path / "login", 1, env={"SLURM_CONF": str(cluster.conf)}) as hosts:
        yield hosts


def _login_fields(login) -> dict:
    return {"login": login.hosts[0].label, "key": login.identity, "known_hosts": login.known_hosts}


def test_through_a_login_node_over_ssh(orch, cluster, login, slurm_section, job):
    """orch here, Slurm's commands on the login node (its key checked against known_hosts); the store a folder both
    see (a shared filesystem: checked by a file written here and read there)."""
    del orch.env["SLURM_CONF"]  # this machine knows no cluster: only the login node does
    path = orch.sweep(
        f'name: viassh\ncommand: "{job(steps=3)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"grid:\n  lr: [1, 2]\n{slurm_section(**_login_fields(login))}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    runs = status(orch, "viassh")
    assert {v["state"] for v in runs.values()} == {"succeeded"} and len(runs) == 2, runs
    assert len([j for j in cluster.jobs() if j["name"].startswith("orch_viassh_")]) == 2
    assert list(login.hosts[0].home.glob("orch/code/*/.complete")), "orch's code was installed through the login node"


def test_a_login_node_whose_key_is_not_known_is_refused_with_the_fix(orch, cluster, login, slurm_section, job):
    login.known_hosts.write_text("")
    path = orch.sweep(
        f'name: nokey\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\n{slurm_section(**_login_fields(login))}'
    )
    r = orch("launch", str(path))
    assert r.code != 0, r.out + r.err
    no_traceback(r)
    assert "ssh-keyscan" in r.err and "never trusts a host key" in r.err, r.err
    assert not cluster.jobs() and not starts(job.marks)


@pytest.mark.timeout(300)
def test_a_killed_controller_relaunched_adopts_the_queued_and_running_jobs(orch, cluster, slurm_section, job):
    """One run's job runs, another's pends (the cluster holds one at a time): the relaunched controller submits
    nothing new for either, and both end in their first attempt."""
    import os
    import signal

    path = orch.sweep(
        f'name: adopt\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"grid:\n  lr: [1, 2]\n{slurm_section(sbatch='[--cpus-per-task=2, --nodelist=n1]')}"
    )
    r = orch("launch", str(path), "--detach")
    assert r.code == 0, r.err
    retry_until(lambda: len(starts(job.marks)) == 1, 120, 0.2, "one run started")
    retry_until(lambda: len(cluster.queued()) == 2, 60, 0.2, "the other job queued")
    lock = orch.home / "locks" / "adopt.lock"
    os.kill(int(lock.read_text().strip()), signal.SIGKILL)
    relaunch = orch.popen("launch", str(path))
    try:
        retry_until(lambda: lock.exists() and lock.read_text().strip() == str(relaunch.pid), 60, 0.2, "adopted")
        job.release.touch()
        assert relaunch.wait(240) == 0, relaunch.stdout.read() if relaunch.stdout else ""
    finally:
        relaunch.kill()
    runs = status(orch, "adopt")
    assert {(v["state"], v["attempt"]) for v in runs.values()} == {("succeeded", 1)}, runs
    assert len([j for j in cluster.jobs() if j["name"].startswith("orch_adopt_")]) == 2  # nothing submitted twice
    assert not (job.marks / "DUPLICATE").exists()


@pytest.mark.timeout(300)
def test_slurmctld_restarting_mid_sweep_fails_nothing(orch, cluster, slurm_section, job):
    path = orch.sweep(
        f'name: ctld\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"grid:\n  lr: [1, 2]\n{slurm_section()}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: len(starts(job.marks)) == 2, 120, 0.2, "both runs started")
    cluster.stop_controller()
    log = orch.home / "logs" / "ctld-controller.log"
    mark = log.stat().st_size
    retry_until(lambda: log.stat().st_size > mark, 60, 0.5, "a controller pass while slurmctld is down")
    cluster.start_controller()
    job.release.touch()
    retry_until(lambda: {v["state"] for v in status(orch, "ctld").values()} == {"succeeded"}, 180, 1, "both runs' end")
    runs = status(orch, "ctld")
    assert {(v["attempt"], v["failures"]) for v in runs.values()} == {(1, 0)}, runs


def test_a_job_cancelled_outside_orch_is_said_so_and_resumed(orch, cluster, slurm_section, job):
    path = orch.sweep(f'name: outside\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\n{slurm_section()}')
    assert orch("launch", str(path), "--detach").code == 0
    first = _job_of(cluster, "outside")
    retry_until(lambda: starts(job.marks), 60, 0.2, "the run started")
    assert cluster.run("scancel", first["id"]).returncode == 0
    _job_of(cluster, "outside", attempt=2)
    shown = retry_until(
        lambda: (lambda out: out if "cancelled outside orch" in out else None)(orch("status", "outside").out),
        60,
        0.5,
        "`orch status` saying so",
    )
    assert f"job {first['id']}" in shown, shown
    job.release.touch()
    retry_until(lambda: status(orch, "outside").get("run", {}).get("state") == "succeeded", 120, 1, "the run's end")
    assert status(orch, "outside")["run"]["failures"] == 0


def test_nodes_that_cannot_start_a_job_fail_the_run_instead_of_resubmitting_forever(orch, slurm_section, job, tmp_path):
    """Slurm requeues a job its node cannot launch; orch counts that as the attempt's failure (its agent never
    started), so the run fails after max_restarts, saying why, instead of a new job every pass."""
    from tests.slurmcluster import SlurmCluster

    with SlurmCluster(tmp_path / "broken", broken=True) as broken:
        orch.env["SLURM_CONF"] = str(broken.conf)
        path = orch.sweep(
            f'name: broken\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\nmax_restarts: 1\n{slurm_section()}'
        )
        r = orch("launch", str(path), timeout=200)
        assert r.code != 0, r.out + r.err
        final = status(orch, "broken")["run"]
        assert (final["state"], final["attempt"], final["failures"]) == ("failed", 2, 2), final
        assert "requeued by Slurm before orch's agent started" in final["reason"], final
        assert not starts(job.marks) and not broken.queued(), broken.jobs()


def test_prune_search_and_seeds_on_slurm_as_anywhere(orch, cluster, slurm_section, tmp_path):
    """The generic parts through jobs: a `prune:` run below the cutoff is stopped at its rung (its job cancelled,
    nothing of it left in the queue) and keeps what it wrote; a search's trials are jobs, asked and told; seeds."""
    from tests.e2e.local.test_stopped_runs import SCRIPT

    script = tmp_path / "curve.py"
    script.write_text(SCRIPT)
    path = orch.sweep(
        f'name: pruny\ncommand: "{{python}} {script} {{x}} {tmp_path / "ready"}"\nworkdir: null\nstore: store\n'
        "grid:\n  x: [9, 1]\nmax_parallel: 1\nprune:\n  metric: acc\n  rungs: [1]\n  keep: 0.5\n  min_runs: 2\n"
        f"{slurm_section()}"
    )
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    states = status(orch, "pruny")
    assert states["x=1"]["state"] == "pruned" and states["x=9"]["state"] == "succeeded", states
    assert "last words of x=1" in orch("logs", "pruny/x=1").out
    assert not cluster.queued(), cluster.jobs()

    trial = tmp_path / "trial.py"
    trial.write_text(
        "import json, os\nacc = float(json.loads(os.environ['ORCH_PARAMS_JSON'])['lr'])\n"
        "open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a').write(json.dumps({'acc': acc}) + '\\n')\n"
    )
    path = orch.sweep(
        f'name: searchy\ncommand: "{{python}} {trial}"\nworkdir: null\nstore: store\nmax_parallel: 2\nseeds: 2\n'
        "target: {metric: acc, value: 0.5}\nsearch:\n  sampler: random\n  trials: 3\n  space:\n"
        f"    lr: {{low: 0.0, high: 1.0}}\n{slurm_section()}",
        name="search.yaml",
    )
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    runs = status(orch, "searchy")
    assert len(runs) == 6 and {v["state"] for v in runs.values()} == {"succeeded"}, runs
    assert len([j for j in cluster.jobs() if j["name"].startswith("orch_searchy_")]) == 6
    c = orch("collect", "searchy")
    assert c.code == 0 and "target" in c.out, c.out + c.err


def test_attach_shows_the_run_live_on_its_node_through_srun(orch, cluster, slurm_section, job):
    path = orch.sweep(f'name: peek\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\n{slurm_section()}')
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: starts(job.marks), 120, 0.2, "the run started")
    with orch.in_a_terminal("attach", "run") as (screen, _):
        retry_until(lambda: "tick" in screen() and "of run" in screen(), 30, 0.2, "the run's output through srun")
    job.release.touch()
    retry_until(lambda: status(orch, "peek")["run"]["state"] == "succeeded", 60, 1, "the run's end")


@pytest.mark.timeout(600)
def test_a_run_of_two_nodes_is_one_job_and_trains_as_one(orch, cluster, slurm_section, tmp_path):
    """`resources: nodes: 2`: one job of two nodes, an agent on each (srun), torchrun's rendezvous at the job's first
    node as Slurm reaches it; the weights are those of the same training as one node of two processes."""
    import subprocess
    import sys

    from tests.unit.trainer.test_train import EIGHT_PX, _free_port, final_weights, same, trainer_env

    args = [*EIGHT_PX, "--epochs", "2"]
    ref = tmp_path / "ref"
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(_free_port()), "-m", "trainer", *args, "--out", str(ref)],
        env=trainer_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    command = " ".join(["{torchrun}", "-m", "trainer", *args])
    path = orch.sweep(
        f'name: span\ncommand: "{command}"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"resources:\n  nodes: 2\n  procs_per_node: 1\n{slurm_section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    v = status(orch, "span")["run"]
    assert (v["state"], v["attempt"]) == ("succeeded", 1), v
    jobs = [j for j in cluster.jobs() if j["name"].startswith("orch_span_")]
    assert len(jobs) == 1 and jobs[0]["nodes"] == "n[1-2]", jobs
    assert same(final_weights(ref), final_weights(orch.store("span", "run")))


@pytest.mark.timeout(300)
def test_a_job_preempted_by_a_higher_partitions_job_resumes_after_it(orch, cluster, slurm_section, script):
    """PreemptMode=REQUEUE: someone's job in the partition `high` takes the node; Slurm requeues orch's job, and the
    run resumes in a new job (waiting for the node) from its newest checkpoint, no failure counted."""
    counter = script(COUNTER, "counter.py")
    path = orch.sweep(
        f'name: preempted\ncommand: "{{python}} {counter} 30"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"{slurm_section(sbatch='[--nodelist=n1]')}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: list(orch.store("preempted", "run").glob("ckpt/*/MANIFEST.json")), 120, 0.2, "a checkpoint")
    first = _job_of(cluster, "preempted")
    r = cluster.run(
        "sbatch", "--parsable", "-p", "high", "--nodelist=n1", "--exclusive", "-J", "theirs", "--wrap", "sleep 3"
    )
    assert r.returncode == 0, r.stderr
    retry_until(lambda: status(orch, "preempted").get("run", {}).get("state") in ("succeeded", "failed"), 180, 1, "end")
    final = status(orch, "preempted")["run"]
    assert final["state"] == "succeeded" and final["attempt"] >= 2 and final["failures"] == 0, final
    assert "resumed from step" in orch("logs", "run", "--attempt", str(final["attempt"])).out
    theirs = next(j for j in cluster.jobs() if j["name"] == "theirs")
    assert theirs["state"] == "COMPLETED", theirs  # theirs ran, ours made room
    assert first["id"] not in {j["id"] for j in cluster.queued()}


def test_a_node_without_the_python_it_names_fails_the_run_saying_so(orch, cluster, slurm_section, job):
    """The job ends before orch's agent could start (no such interpreter on the node): each such attempt counts as
    a failure, with what the job printed, instead of a new job every pass."""
    path = orch.sweep(
        f'name: nopy\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\nmax_restarts: 1\n'
        f"{slurm_section(python='/opt/none/python3')}"
    )
    r = orch("launch", str(path), timeout=200)
    assert r.code != 0, r.out + r.err
    final = status(orch, "nopy")["run"]
    assert (final["state"], final["attempt"], final["failures"]) == ("failed", 2, 2), final
    assert "before orch's agent started" in final["reason"] and "no /opt/none/python3 on" in final["reason"], final
    assert len([j for j in cluster.jobs() if j["name"].startswith("orch_nopy_")]) == 2
