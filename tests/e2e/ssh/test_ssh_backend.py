"""`backend: ssh` end to end through `orch launch`, on real sshd hosts on loopback (tests/fakessh.py) that orch did
not make: runs spread over the hosts' slots, the store reached through the controller's connection, a host's key
checked against known_hosts, and `orch down` leaving nothing of orch's (and everything of anyone else's)."""

from __future__ import annotations

import json

import pytest

from orchestrator.wait import retry_until
from tests.conftest import no_traceback, starts
from tests.conftest import run_states as status
from tests.fakessh import SshHosts

pytestmark = pytest.mark.slow


def hosts_of(orch, sweep: str) -> dict[str, str]:
    """run -> the host its record names (as `orch status --all` shows it in its table)."""
    records = orch.store(sweep, ".orch").glob("*/status.json")
    return {p.parent.name: json.loads(p.read_text())["host"] for p in records}


@pytest.fixture
def hosts(tmp_path):
    with SshHosts(tmp_path / "machines", 2) as h:
        yield h


def test_four_runs_over_two_hosts_with_a_folder_store(orch, hosts, job):
    path = orch.sweep(
        f'name: lab\ncommand: "{job(steps=5)}"\nworkdir: null\nstore: store\nmax_parallel: 4\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2, 3, 4]\n{hosts.section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    runs = status(orch, "lab")
    assert len(runs) == 4 and {v["state"] for v in runs.values()} == {"succeeded"}, runs
    assert set(hosts_of(orch, "lab").values()) == {h.label for h in hosts.hosts}, runs  # both hosts served
    assert not (job.marks / "DUPLICATE").exists()
    assert orch.store("lab").joinpath(next(iter(runs)), "metrics.jsonl").exists()
    assert "tick 4" in orch("logs", next(iter(runs))).out
    r = orch("collect", "lab")
    assert r.code == 0 and "GPU-h" in r.out and "$" not in r.out, r.out  # no price given: no dollars


def test_a_host_with_a_changed_key_is_refused_and_the_sweep_runs_on_the_other(orch, hosts, job):
    hosts.hosts[1].kill()
    hosts.hosts[1].rekey()  # reinstalled: known_hosts still has its old key
    hosts.restart(1)
    path = orch.sweep(
        f'name: rekeyed\ncommand: "{job(steps=2)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2]\n{hosts.section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    assert "not the one" in r.err and hosts.hosts[1].label.split("@")[1].split(":")[0] in r.err, r.err
    assert "ssh-keygen -R" in r.err, r.err  # the fix
    runs = status(orch, "rekeyed")
    assert set(hosts_of(orch, "rekeyed").values()) == {hosts.hosts[0].label}, runs
    assert not list(hosts.hosts[1].home.glob("orch/runs/*")), "nothing was started on the refused host"


def test_no_usable_host_starts_nothing(orch, hosts, job):
    hosts.known_hosts.write_text("")  # the user never checked these machines' keys
    path = orch.sweep(
        f'name: unknown\ncommand: "{job(steps=2)}"\nworkdir: null\nstore: store\nbackend: ssh\n{hosts.section()}'
    )
    r = orch("launch", str(path))
    assert r.code == 2, r.out + r.err
    no_traceback(r)
    assert "no host can run this sweep" in r.err and "ssh-keyscan" in r.err, r.err
    assert not starts(job.marks) and not list(hosts.hosts[0].home.glob("orch/runs/*"))


def test_orch_down_leaves_nothing_of_orchs_and_everything_of_anyone_elses(orch, hosts, job):
    others = [h.foreign() for h in hosts.hosts]
    try:
        path = orch.sweep(
            f'name: downed\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
            f"backend: ssh\ngrid:\n  lr: [1, 2]\n{hosts.section()}"
        )
        assert orch("launch", str(path), "--detach").code == 0
        retry_until(lambda: len(starts(job.marks)) == 2, 60, 0.2, "both runs started")
        r = orch("down", "downed")
        assert r.code == 0, r.out + r.err
        for h, other in zip(hosts.hosts, others):
            assert other.poll() is None, "someone else's process on the host was killed"
            left = [p for p in h.processes() if p != other.pid]
            what = [open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ")[:120] for p in left]
            assert not left, f"{h.label}: processes of orch's left: {what}"
            assert not list(h.home.glob("orch/runs/downed")) and not list(h.home.glob("orch/tunnels/downed*"))
    finally:
        for other in others:
            other.kill()


@pytest.mark.timeout(600)
def test_a_host_powered_off_mid_run_loses_nothing_but_time(orch, hosts, tmp_path):
    """The host a run trains on is killed (its sshd and every process): the run resumes on the other host from its
    newest checkpoint in the store, and ends with the weights of a run never interrupted."""
    from tests.e2e.local.test_spot import LONGER, TRAIN
    from tests.unit.trainer.test_train import final_weights, run_trainer, same

    reference = tmp_path / "reference"
    run_trainer([*LONGER, "--out", str(reference)])
    path = orch.sweep(
        f'name: power\ncommand: "{TRAIN}"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"backend: ssh\n{hosts.section()}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    ckpts = orch.store("power", "run")

    def first_host():
        stored = list(ckpts.glob("ckpt/*/MANIFEST.json"))
        return hosts_of(orch, "power").get("run") if stored else None

    label = retry_until(first_host, 180, 0.2, "a checkpoint in the store")
    victim = next(h for h in hosts.hosts if h.label == label)
    victim.kill()
    retry_until(
        lambda: status(orch, "power").get("run", {}).get("state") in ("succeeded", "failed"), 300, 1, "the run's end"
    )
    final = status(orch, "power")["run"]
    assert (final["state"], final["attempt"], final["failures"]) == ("succeeded", 2, 0), final
    assert hosts_of(orch, "power")["run"] != label
    assert "resumed from" in orch("logs", "run", "--attempt", "2").out
    assert same(final_weights(reference), final_weights(ckpts))


def _controller_pid(orch, sweep: str) -> int:
    lock = orch.home / "locks" / f"{sweep}.lock"
    return int(retry_until(lambda: lock.exists() and lock.read_text().strip(), 30, 0.1, "the controller's lock"))


@pytest.mark.timeout(300)
def test_a_killed_controller_relaunched_adopts_what_runs(orch, hosts, job):
    """The agents lose their way to the store with the controller; the next one serves it anew (another port, another
    token in the hosts' endpoint files) and adopts the runs where they are: no second attempt, no duplicate."""
    import os
    import signal

    path = orch.sweep(
        f'name: adopt\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2]\n{hosts.section()}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: len(starts(job.marks)) == 2, 60, 0.2, "both runs started")
    os.kill(_controller_pid(orch, "adopt"), signal.SIGKILL)
    relaunch = orch.popen("launch", str(path))
    try:
        retry_until(lambda: _controller_pid(orch, "adopt") == relaunch.pid, 60, 0.2, "the new controller")
        job.release.touch()
        assert relaunch.wait(120) == 0, relaunch.stdout.read() if relaunch.stdout else ""
    finally:
        relaunch.kill()
    runs = status(orch, "adopt")
    assert {(v["state"], v["attempt"]) for v in runs.values()} == {("succeeded", 1)}, runs
    assert len(starts(job.marks)) == 2 and not (job.marks / "DUPLICATE").exists()


def test_the_users_own_code_reaches_the_hosts_through_the_controller(orch, hosts, tmp_path):
    """`workdir:` (the sweep file's folder by default): a user's train.py beside the sweep file runs on the hosts,
    its snapshot fetched through the tunnel (the hosts cannot reach this machine's folder store otherwise)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, helper\nopen(os.path.join(os.environ['ORCH_RUN_DIR'], 'out.txt'), 'w').write(helper.WORD)\n"
    )
    (project / "helper.py").write_text("WORD = 'from the project'\n")
    (project / "sweep.yaml").write_text(
        f'name: mine\ncommand: "{{python}} train.py"\nstore: {tmp_path / "store"}\nbackend: ssh\n{hosts.section()}'
    )
    r = orch("launch", str(project / "sweep.yaml"))
    assert r.code == 0, r.out + r.err
    assert (tmp_path / "store" / "mine" / "run" / "out.txt").read_text() == "from the project"


def test_an_s3_store_is_reached_by_the_controller_alone(orch, hosts, job, cloud):
    """With `store: s3://...` the hosts still get no AWS credentials: the controller carries their writes to S3
    with the S3 store's own index and checksums, and a sweep on it reads as any other."""
    from tests.fakecloud import BUCKET

    path = orch.sweep(
        f'name: clouded\ncommand: "{job(steps=3)}"\nworkdir: null\nstore: s3://{BUCKET}/lab\nmax_parallel: 2\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2]\n{hosts.section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    runs = status(orch, "clouded")
    assert {v["state"] for v in runs.values()} == {"succeeded"}, runs
    keys = [o["Key"] for o in cloud.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="lab/clouded/")["Contents"]]
    assert {"lab/clouded/lr=1/metrics.jsonl", "lab/clouded/lr=1/.orch-sync.json"} <= set(keys), keys
    assert "tick 2" in orch("logs", "lr=1").out
    tasks = [json.loads(t.read_text()) for h in hosts.hosts for t in h.home.glob("orch/runs/clouded/*/ctl/task-*.json")]
    assert len(tasks) == 2 and all(t["store_url"].startswith("tunnel:") for t in tasks), tasks
    assert not any(k.startswith("AWS_") for t in tasks for k in t["env"]), "a host got AWS settings"


def test_runs_share_a_host_by_its_gpus_and_collect_counts_gpu_hours_and_dollars(orch, hosts, script):
    """Two GPUs a host, one a run: two runs at once on each, each its own CUDA_VISIBLE_DEVICES; `orch collect`
    gives GPU-hours, and dollars at the host-hour's price (shared by the runs the host held)."""
    seen = orch.tmp / "devices"
    seen.mkdir()
    job = script(
        f"""
        import os, time
        open(os.path.join({str(seen)!r}, os.environ["ORCH_RUN_ID"]), "w").write(os.environ["CUDA_VISIBLE_DEVICES"])
        while len(os.listdir({str(seen)!r})) < 4:  # all four at once, or none ends
            time.sleep(0.1)
        """
    )
    path = orch.sweep(
        f'name: packed\ncommand: "{{python}} {job}"\nworkdir: null\nstore: store\nmax_parallel: 4\n'
        f"resources:\n  gpus: 1\nbackend: ssh\ngrid:\n  lr: [1, 2, 3, 4]\n"
        f"{hosts.section(gpus=2, extra='  price_per_hour: 3.6')}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    by_host: dict[str, list[str]] = {}
    for run, host in hosts_of(orch, "packed").items():
        by_host.setdefault(host, []).append((seen / run).read_text())
    assert sorted(sorted(v) for v in by_host.values()) == [["0", "1"], ["0", "1"]], by_host
    r = orch("collect", "packed")
    assert r.code == 0 and "GPU-h" in r.out and "$" in r.out, r.out + r.err
    rows = {row["run_id"]: row for row in csv_rows(orch.tmp / "results" / "packed" / "runs.csv")}
    assert all(float(row["gpu_hours"]) > 0 and float(row["cost_usd"]) > 0 for row in rows.values()), rows
    # the host-hour at 3.6 $ is shared by its 2 slots: each attempt holds 1 GPU at 1.8 $/h, and has ended
    ledger = json.loads(orch.store("packed", "cost.json").read_text())
    assert sorted((e["run"], e["gpus"], e["price_per_h"]) for e in ledger.values()) == [
        (f"lr={k}", 1, 1.8) for k in (1, 2, 3, 4)
    ], ledger
    assert all(e["end"] and e["end"] >= e["start"] for e in ledger.values()), ledger


def csv_rows(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(300)
def test_a_host_down_at_launch_is_used_once_it_answers(orch, hosts, job):
    hosts.hosts[1].kill()
    path = orch.sweep(
        f'name: later\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2]\n{hosts.section()}"
    )
    r = orch("launch", str(path), "--detach")
    assert r.code == 0 and "not answering" in r.err and hosts.hosts[1].ip in r.err, r.out + r.err
    retry_until(lambda: len(starts(job.marks)) == 1, 60, 0.2, "the first run on the host that answers")
    hosts.restart(1)
    retry_until(lambda: len(starts(job.marks)) == 2, 90, 0.5, "the second run, on the host that came back")
    assert set(hosts_of(orch, "later").values()) == {h.label for h in hosts.hosts}
    job.release.touch()
    retry_until(lambda: {v["state"] for v in status(orch, "later").values()} == {"succeeded"}, 60, 1, "the end")


def test_attach_opens_the_runs_window_on_its_host(orch, hosts, job):
    path = orch.sweep(
        f'name: peek\ncommand: "{job(release=True)}"\nworkdir: null\nstore: store\nbackend: ssh\n{hosts.section()}'
    )
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: len(starts(job.marks)) == 1, 60, 0.2, "the run started")
    with orch.in_a_terminal("attach", "run") as (screen, _):
        retry_until(lambda: "tick" in screen() and "of run" in screen(), 20, 0.2, "the run's output over ssh")
    job.release.touch()
    retry_until(lambda: status(orch, "peek")["run"]["state"] == "succeeded", 60, 1, "the run's end")


def test_a_host_without_the_python_it_names_is_left_out_with_the_fix(orch, hosts, job):
    section = hosts.section().replace(
        f"    - {hosts.hosts[1].label}", f"    - host: {hosts.hosts[1].label}\n      python: /opt/none/python3"
    )
    path = orch.sweep(
        f'name: nopy\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        f"backend: ssh\ngrid:\n  lr: [1, 2]\n{section}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    assert "left out" in r.err and "no /opt/none/python3 there" in r.err and "`python:` of the host" in r.err, r.err
    assert set(hosts_of(orch, "nopy").values()) == {hosts.hosts[0].label}


def test_the_dry_run_lists_each_host_with_its_slots_or_why_not(orch, hosts, job):
    hosts.hosts[1].kill()
    path = orch.sweep(
        f'name: dry\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\nresources:\n  gpus: 1\n'
        f"backend: ssh\n{hosts.section(gpus=2)}"
    )
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.out + r.err
    assert "hosts: 1 of 2 can run this sweep, 2 run(s) at once" in r.out, r.out
    assert f"{hosts.hosts[0].label}: 2 GPU(s), 2 slot(s)" in r.out and f"{hosts.hosts[1].label}: left out" in r.out
    assert "counts GPU-hours, not dollars" in r.out and not starts(job.marks)


@pytest.mark.timeout(600)
def test_a_run_of_two_nodes_spans_two_hosts_and_trains_as_one(orch, hosts, tmp_path):
    """`resources: nodes: 2`: a slot on each of two hosts at once, a real torchrun rendezvous at node 0's address;
    the weights are those of the same training as one node of two processes, launched by hand."""
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
        f"resources:\n  nodes: 2\n  procs_per_node: 1\nbackend: ssh\n{hosts.section()}"
    )
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    v = status(orch, "span")["run"]
    assert (v["state"], v["attempt"]) == ("succeeded", 1), v
    tasks = [json.loads(t.read_text()) for h in hosts.hosts for t in h.home.glob("orch/runs/span/run/ctl/task-1.json")]
    assert sorted(t["node_rank"] for t in tasks) == [0, 1] and len({t["host"] for t in tasks}) == 2, tasks
    lead = next(t for t in tasks if t["node_rank"] == 0)
    assert {t["env"]["ORCH_MASTER_ADDR"] for t in tasks} == {lead["host"].split("@")[1].split(":")[0]}
    assert same(final_weights(ref), final_weights(orch.store("span", "run")))


def test_gc_lists_what_a_finished_sweep_left_on_the_hosts_and_down_removes_it(orch, hosts, job):
    path = orch.sweep(
        f'name: tidy\ncommand: "{job(steps=1)}"\nworkdir: null\nstore: store\nbackend: ssh\n{hosts.section()}'
    )
    assert orch("launch", str(path)).code == 0
    h = next(h for h in hosts.hosts if h.label in set(hosts_of(orch, "tidy").values()))
    r = orch("gc")
    assert r.code == 0, r.out + r.err
    assert f"{h.label} tidy:" in r.out and "~/orch/runs/tidy/" in r.out, r.out  # the run folders stay until down
    assert f"{h.label} orch-code" in r.out and "remove with `orch down orch-code`" in r.out, r.out
    r = orch("down", "orch-code")
    assert r.code == 0 and not (h.home / "orch" / "code").exists(), r.out + r.err
    assert orch("down", "tidy").code == 0
    assert not (h.home / "orch" / "runs" / "tidy").exists()
    assert "tidy" not in orch("gc").out


@pytest.mark.timeout(400)
def test_chaos_drop_and_interrupt_each_resume_the_run_on_a_host(orch, hosts, tmp_path):
    """`orch chaos drop`: the host goes without notice, the run resumes from its newest stored checkpoint; then
    `orch chaos interrupt`: the notice, a checkpoint, and the run resumes again (a preemption, not a failure).

    The run is a counter of half-second steps that checkpoints every 10 and on SIGUSR1, not the trainer: what is
    tested is orch's path, and a trainer run resumed near its end once finished before the notice was handled
    (beside two CPU hogs: attempt 2 succeeded, `chaos interrupt` waited its 120 s). 80 steps leave the interrupt
    half a minute of wall time whatever the load."""
    from tests.e2e.slurm.test_slurm_backend import COUNTER

    counter = tmp_path / "counter.py"
    counter.write_text(COUNTER)
    path = orch.sweep(
        f'name: dropped\ncommand: "{{python}} {counter} 80"\nworkdir: null\nstore: store\nmax_restarts: 0\n'
        f"backend: ssh\n{hosts.section()}"
    )
    assert orch("launch", str(path), "--detach").code == 0
    ckpts = orch.store("dropped", "run")
    retry_until(lambda: list(ckpts.glob("ckpt/*/MANIFEST.json")), 120, 0.2, "a checkpoint in the store")
    r = orch("chaos", "drop", "run")
    assert r.code == 0 and "without warning" in r.out, r.out + r.err
    retry_until(lambda: status(orch, "dropped")["run"]["attempt"] == 2, 120, 0.5, "the second attempt")
    metrics = orch.store("dropped", "run", "metrics.jsonl")
    seen = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    retry_until(lambda: len(metrics.read_text().splitlines()) > seen + 5, 120, 0.2, "the second attempt training")
    r = orch("chaos", "interrupt", "run")
    assert r.code == 0 and "interrupted dropped/run" in r.out, r.out + r.err
    retry_until(lambda: status(orch, "dropped")["run"]["state"] in ("succeeded", "failed"), 240, 1, "the run's end")
    final = status(orch, "dropped")["run"]
    assert (final["state"], final["attempt"], final["failures"], final["preemptions"]) == ("succeeded", 3, 0, 2), final
    assert "resumed from" in orch("logs", "run", "--attempt", "2").out
    assert "resumed from" in orch("logs", "run", "--attempt", "3").out


@pytest.mark.timeout(300)
def test_prune_and_search_work_on_ssh_hosts_as_anywhere(orch, hosts, tmp_path):
    """The generic parts through the hosts' tunnel: a `prune:` run below the cutoff is stopped at its rung and keeps
    what it wrote; a search's trials are asked and told, and the target is met."""
    from tests.e2e.local.test_stopped_runs import SCRIPT

    script = tmp_path / "curve.py"
    script.write_text(SCRIPT)
    path = orch.sweep(
        f'name: pruny\ncommand: "{{python}} {script} {{x}} {tmp_path / "ready"}"\nworkdir: null\nstore: store\n'
        "grid:\n  x: [9, 1]\nmax_parallel: 1\nprune:\n  metric: acc\n  rungs: [1]\n  keep: 0.5\n  min_runs: 2\n"
        f"backend: ssh\n{hosts.section()}"
    )
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    states = status(orch, "pruny")
    assert states["x=1"]["state"] == "pruned" and states["x=9"]["state"] == "succeeded", states
    assert "last words of x=1" in orch("logs", "pruny/x=1").out

    trial = tmp_path / "trial.py"
    trial.write_text(
        "import json, os\nacc = float(json.loads(os.environ['ORCH_PARAMS_JSON'])['lr'])\n"
        "open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'a').write(json.dumps({'acc': acc}) + '\\n')\n"
    )
    path = orch.sweep(
        f'name: searchy\ncommand: "{{python}} {trial}"\nworkdir: null\nstore: store\nmax_parallel: 2\n'
        "target: {metric: acc, value: 0.5}\nsearch:\n  sampler: random\n  trials: 4\n  space:\n"
        f"    lr: {{low: 0.0, high: 1.0}}\nbackend: ssh\n{hosts.section()}",
        name="search.yaml",
    )
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    runs = status(orch, "searchy")
    assert len(runs) == 4 and {v["state"] for v in runs.values()} == {"succeeded"}, runs
    c = orch("collect", "searchy")
    assert c.code == 0 and "target" in c.out, c.out + c.err
