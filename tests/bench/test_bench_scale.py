"""Benchmark: what a sweep of 10,000 runs costs (issue "Scale"), with a count of requests.

10,000 runs, 9,000 finished, 20 running (a host each), the rest queued. Measured side by side in one
command:

- against moto's S3: S3 requests and controller CPU per pass (steady state, after the first pass), the
  first pass of a fresh controller (no summary: it lists and reads every record), of a restarted one
  (from the summary) and of a new sweep of 10,000 runs (nothing recorded yet), and `observe` (what
  `orch status` does) from the summary against reading every record;
- on a folder store through the real CLI: `orch status NAME`, `--json`, `--all`, `orch collect NAME`
  (wall time and the child's max RSS) and `orch launch --dry-run`.

Controller CPU is the controller thread's own (`time.thread_time`): moto's server answers in other threads
of this same process, so the process's CPU (printed beside it) counts the fake S3's work too. With 20 active
runs the controller reads sequentially (a pool only above 64 reads), so its thread holds all of botocore's work.

The hosts of the 20 running runs are a test double (a backend whose list() returns them): what is
measured is the controller's reading of the store, not a cloud's API.

    scripts/test.sh tests/bench/test_bench_scale.py -m bench -s
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchestrator.control.actions import observe
from orchestrator.control.controller import Controller
from orchestrator.control.state import State
from orchestrator.store.base import json_bytes
from orchestrator.store.status import RunStatus, status_key
from tests.unit.control.test_scale import Hosts, make_sweep

pytestmark = pytest.mark.bench

RUNS, FINISHED, ACTIVE = 10_000, 9_000, 20


def fill(store, sweep) -> Hosts:
    """9,000 succeeded records with a metrics file each, 20 running with a host, the rest never written."""
    hosts = Hosts(sweep.spec.name, store)
    now = time.time()
    ids = [r.run_id for r in sweep.runs]

    def put(i: int) -> None:
        rid = ids[i]
        if i < FINISHED:
            st = RunStatus(
                run_id=rid,
                state="succeeded",
                attempt=1,
                started_at=now - 60,
                heartbeat=now - 1,
                finished_at=now - 1,
                exit_code=0,
                last_metrics={"epoch": 3, "test_acc": (i % 97) / 100},
            )
            lines = "".join(
                json.dumps({"step": s, "epoch": s, "test_acc": (i % 97) / 100 * s / 3, "train_loss": 2.0 / (s + 1)})
                + "\n"
                for s in (1, 2, 3)
            )
            store.put_bytes(f"{sweep.spec.name}/{rid}/metrics.jsonl", lines.encode())
        else:
            st = RunStatus(run_id=rid, state="running", attempt=1, started_at=now, heartbeat=now + 3600)
        store.put_bytes(status_key(sweep.spec.name, rid), json_bytes(st.__dict__))

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(put, range(FINISHED + ACTIVE)))
    for rid in ids[FINISHED : FINISHED + ACTIVE]:
        hosts.hosts[rid] = __import__("orchestrator.backends.base", fromlist=["Host"]).Host(
            run_id=rid, host_id=f"h-{rid}", address="x", attempt=1
        )
    return hosts


def counted(client) -> list:
    calls = []
    client.meta.events.register("before-call.s3", lambda **kw: calls.append(kw["model"].name))
    return calls


@pytest.mark.timeout(1800)
def test_ten_thousand_runs_on_s3(tmp_path, monkeypatch):
    from orchestrator.store.s3 import S3Store
    from tests.fakecloud import BUCKET, FakeCloud

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    with FakeCloud(tmp_path / "cloud") as cloud:
        client = cloud.client("s3")
        store = S3Store(f"s3://{BUCKET}/scale", client=client)
        sweep = make_sweep(tmp_path, "scale", RUNS, ACTIVE, "unused")
        hosts = fill(store, sweep)
        calls = counted(client)
        c = Controller(sweep, hosts, store, State(tmp_path / "home"))
        c.prepare()
        del calls[:]
        t0, cpu0 = time.perf_counter(), time.process_time()
        c.step()
        first = (len(calls), time.perf_counter() - t0, time.process_time() - cpu0)
        steady = []
        for _ in range(5):
            del calls[:]
            t0, cpu0, own0 = time.perf_counter(), time.process_time(), time.thread_time()
            c.step()
            steady.append((len(calls), time.perf_counter() - t0, time.thread_time() - own0, time.process_time() - cpu0))
        del calls[:]
        restarted = Controller(sweep, hosts, store, State(tmp_path / "home"))
        t0 = time.perf_counter()
        restarted.step()
        again = (len(calls), time.perf_counter() - t0)
        del calls[:]
        new = make_sweep(tmp_path, "new", RUNS, ACTIVE, "unused")  # a new sweep of 10,000 runs: nothing recorded yet
        fresh = Controller(new, Hosts("new", store), store, State(tmp_path / "home"))
        fresh.prepare()
        del calls[:]
        t0 = time.perf_counter()
        fresh.step()
        launched = (len(calls), time.perf_counter() - t0)
        del calls[:]
        t0 = time.perf_counter()
        p = observe(sweep, hosts, store)
        summary = (len(calls), time.perf_counter() - t0)
        del calls[:]
        t0 = time.perf_counter()
        observe(sweep, hosts, store, every=True)
        full = (len(calls), time.perf_counter() - t0)
    steady.sort(key=lambda row: row[2])
    median = steady[len(steady) // 2]
    print(f"\n10,000 runs on moto's S3 ({FINISHED} finished, {ACTIVE} running):")
    print(
        f"  a new sweep's first pass (lists its records: none; claims {ACTIVE}): {launched[0]} requests, "
        f"{launched[1]:.2f} s"
    )
    print(
        f"  first pass, no summary (lists and reads every record): {first[0]} requests, {first[1]:.1f} s, CPU "
        f"{first[2]:.2f} s"
    )
    print(
        f"  steady pass (median of 5): {median[0]} S3 requests, {median[1]:.3f} s, controller CPU {median[2]:.3f} s"
        f" (the whole process, moto's server included: {median[3]:.3f} s)"
    )
    print(f"  a restarted controller's first pass (from the summary): {again[0]} requests, {again[1]:.2f} s")
    print(f"  orch status (observe, summary + active records): {summary[0]} requests, {summary[1]:.2f} s")
    print(f"  orch status --all (every record): {full[0]} requests, {full[1]:.1f} s")
    assert p.count("succeeded") == FINISHED
    assert (
        max(row[0] for row in steady) <= 25 and again[0] <= 25 and summary[0] <= 25 and launched[0] <= 3 * ACTIVE + 10
    )


def timed(argv, env, cwd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert p.returncode == 0, p.stderr[-2000:]
    return wall, (rss if rss > before else None), p


@pytest.mark.timeout(900)
def test_ten_thousand_runs_through_the_cli(orch, tmp_path):
    from orchestrator.store.folder import LocalStore

    store_dir = tmp_path / "store"
    store = LocalStore(str(store_dir))
    sweep = make_sweep(tmp_path, "scale", RUNS, ACTIVE, str(store_dir))
    hosts = fill(store, sweep)
    c = Controller(sweep, hosts, store, State(orch.home))
    c.prepare()
    c.step()  # writes the summary
    out = {}
    for label, args in (
        ("orch status NAME", ("status", "scale")),
        ("orch status NAME --json", ("status", "scale", "--json")),
        ("orch status NAME --all", ("status", "scale", "--all")),
        ("orch collect NAME", ("collect", "scale", "--out", str(tmp_path / "out"))),
        ("orch launch --dry-run", ("launch", str(sweep.path), "--dry-run")),
    ):
        wall, rss, p = timed(orch.argv(*args), orch.env, orch.tmp)
        out[label] = (wall, rss)
    print("\n10,000 runs, folder store, through the CLI:")
    for label, (wall, rss) in out.items():
        print(f"  {label}: {wall:.1f} s" + (f", max RSS {rss / 1024:.0f} MB" if rss else ""))
    assert out["orch status NAME"][0] < out["orch status NAME --all"][0] * 2  # sanity: both ran
