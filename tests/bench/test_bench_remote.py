"""Benchmark: what the controller itself needs, to size the instance `orch launch --remote` runs it on.

At 1,000 and 10,000 runs (90% finished, 20 running, the rest queued) on moto's S3, the controller runs in
a child process of its own (moto answers in this one), so its peak memory (max RSS) and CPU seconds per
pass are the controller's alone: the first pass of a fresh controller (no summary: it lists and reads
every record) and the steady pass (median of 10). From those: dollars per day of control at the default
`aws.controller.instance_type`, against the goal of a tenth of an on-demand 4-vCPU VM's day.

    /work/tools/t tests/bench/test_bench_remote.py -m bench -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.backends.aws.settings import ControllerSection
from orchestrator.store.base import json_bytes
from orchestrator.store.status import RunStatus, status_key
from tests.unit.control.test_scale import make_sweep

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
ACTIVE = 20
PASS_S = 2.0  # the aws backend's pass interval
# us-east-1 on-demand Linux prices, USD per hour (aws.amazon.com/ec2/pricing/on-demand, 2025)
PRICES = {"t3.nano": 0.0052, "t3.micro": 0.0104, "t3.small": 0.0208, "t4g.micro": 0.0084, "m5.xlarge": 0.192}
MEMORY_MIB = {"t3.nano": 512, "t3.micro": 1024, "t3.small": 2048, "t4g.micro": 1024}
VM_4VCPU = "m5.xlarge"  # SkyPilot's default jobs controller size: 4 vCPUs, 16 GiB

CHILD = r"""
import json, resource, statistics, sys, time
from orchestrator.control.controller import Controller
from orchestrator.control.state import State
from orchestrator.store.s3 import S3Store
from orchestrator.backends.registry import load_sweep
from orchestrator.backends.base import Host
from tests.unit.control.test_scale import Hosts

path, url, home, active = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
sweep = load_sweep(path)
store = S3Store(url)
hosts = Hosts(sweep.spec.name, store)
for rid in active:
    hosts.hosts[rid] = Host(run_id=rid, host_id=f"h-{rid}", address="x", attempt=1)
calls = []
store.client.meta.events.register("before-call.s3", lambda **kw: calls.append(kw["model"].name))
c = Controller(sweep, hosts, store, State(__import__("pathlib").Path(home)))
c.prepare()
cpu0 = time.process_time(); c.step(); first = time.process_time() - cpu0
steady, requests = [], []
for _ in range(10):
    del calls[:]
    cpu0 = time.process_time(); c.step(); steady.append(time.process_time() - cpu0); requests.append(list(calls))
requests.sort(key=len)
print(json.dumps({"first_cpu_s": first, "pass_cpu_s": statistics.median(steady),
    "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "requests": requests[len(requests) // 2]}))
"""


def fill(store, sweep, finished: int) -> list:
    now, ids = time.time(), [r.run_id for r in sweep.runs]

    def put(i: int) -> None:
        rid = ids[i]
        if i < finished:
            st = RunStatus(rid, "succeeded", 1, started_at=now - 60, heartbeat=now, finished_at=now, exit_code=0)
            st.last_metrics = {"epoch": 3, "test_acc": (i % 97) / 100}
            lines = "".join(json.dumps({"step": s, "epoch": s, "test_acc": s / 4}) + "\n" for s in (1, 2, 3))
            store.put_bytes(f"{sweep.spec.name}/{rid}/metrics.jsonl", lines.encode())
        else:
            st = RunStatus(rid, "running", 1, started_at=now, heartbeat=now + 3600)
        store.put_bytes(status_key(sweep.spec.name, rid), json_bytes(st.__dict__))

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(put, range(finished + ACTIVE)))
    return ids[finished : finished + ACTIVE]


def s3_usd_per_day(requests: list) -> float:
    """S3 Standard request prices: PUT/LIST $0.005 per 1,000, GET/HEAD $0.0004 per 1,000."""
    per_pass = sum(0.005 if op.startswith(("Put", "List", "Copy", "Post")) else 0.0004 for op in requests) / 1000
    return per_pass * 86400 / PASS_S


@pytest.mark.timeout(1800)
def test_controller_memory_and_cpu_per_pass_size_its_instance(tmp_path):
    from orchestrator.store.s3 import S3Store
    from tests.fakecloud import BUCKET, FakeCloud

    figures = {}
    with FakeCloud(tmp_path / "cloud") as cloud:
        env = {**os.environ, **cloud.env(), "PYTHONPATH": str(ROOT), "ORCH_HOME": str(tmp_path / "home")}
        for runs in (1_000, 10_000):
            url = f"s3://{BUCKET}/bench{runs}"
            sweep = make_sweep(tmp_path, f"remote{runs}", runs, ACTIVE, url)
            active = fill(S3Store(url, client=cloud.client("s3")), sweep, runs * 9 // 10)
            p = subprocess.run(
                [sys.executable, "-c", CHILD, str(sweep.path), url, str(tmp_path / "home"), json.dumps(active)],
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert p.returncode == 0, p.stderr[-3000:]
            figures[runs] = json.loads(p.stdout.strip().splitlines()[-1])
    default = ControllerSection().instance_type
    day = PRICES[default] * 24
    vm_day = PRICES[VM_4VCPU] * 24
    print(f"\nthe controller in a process of its own, moto's S3, {ACTIVE} running, a pass every {PASS_S:.0f} s:")
    for runs, f in figures.items():
        busy = f["pass_cpu_s"] / PASS_S
        print(
            f"  {runs:>6,} runs: peak memory {f['max_rss_mib']:.0f} MiB, first pass CPU {f['first_cpu_s']:.2f} s, "
            f"steady pass CPU {f['pass_cpu_s']:.3f} s ({busy:.0%} of one vCPU), {len(f['requests'])} S3 requests "
            f"a pass ({dict(Counter(f['requests']))}: ${s3_usd_per_day(f['requests']):.2f} a day in S3 requests)"
        )
    print(
        f"  default {default}: ${day:.2f} a day ({MEMORY_MIB[default]} MiB); an on-demand 4-vCPU VM "
        f"({VM_4VCPU}): ${vm_day:.2f} a day; goal < ${vm_day / 10:.2f}"
    )
    big = figures[10_000]
    assert big["max_rss_mib"] < MEMORY_MIB[default] * 0.5  # half the instance's memory, room for the OS
    assert big["pass_cpu_s"] / PASS_S < 0.2  # a t3's baseline is 10-20% of a vCPU: the pass stays under it
    assert day < vm_day / 10
