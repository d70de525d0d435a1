"""Benchmark: orch's overhead on the local backend.

50 trivial runs (`command: "true"`) with max_parallel 8 through the real `orch launch`, against the
same 50 commands run directly (bash -c true) with the same parallelism, in the same process.
Prints total times, the ratio and the overhead per run. Run it alone with:

    .venv/bin/python -m pytest tests/bench/test_bench_local.py -s
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.bench

N, PARALLEL = 50, 8


def direct(n: int, parallel: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(lambda _: subprocess.run(["bash", "-c", "true"]).returncode, range(n)))
    assert codes == [0] * n
    return time.perf_counter() - t0


def test_fifty_trivial_runs(orch):
    path = orch.sweep(f"""
        name: bench
        command: "true"
        grid:
          i: {list(range(N))}
        max_parallel: {PARALLEL}
        max_restarts: 0
        store: store
    """)
    t_direct = direct(N, PARALLEL)
    t0 = time.perf_counter()
    r = orch("launch", str(path))
    t_orch = time.perf_counter() - t0
    assert r.code == 0, r.out[-2000:] + r.err
    runs = json.loads(orch("status", "bench", "--json").out)["runs"]
    assert len(runs) == N and all(x["state"] == "succeeded" and x["attempt"] == 1 for x in runs)
    figures = {
        "runs": N,
        "max_parallel": PARALLEL,
        "direct_s": round(t_direct, 3),
        "orch_s": round(t_orch, 3),
        "ratio": round(t_orch / t_direct, 1),
        "overhead_per_run_s": round((t_orch - t_direct) / N, 3),
        "latency_per_run_in_a_slot_s": round((t_orch - t_direct) * PARALLEL / N, 3),
    }
    print("\nlocal backend overhead:", json.dumps(figures))
