"""Benchmark: what `workdir:` costs — a 20 MB project (incompressible) on the fake cloud, through `orch launch`.

One instance packs two runs (g5.12xlarge, `resources.gpus: 1`): the first run to start there fetches the snapshot from
the store (S3 on moto) and unpacks it; the second finds it there. Prints the snapshot's time at launch (hash + tar),
the bytes and seconds per host (from the agent's own line in the run's log), and what the second run cost; and, for a
baseline in the same command, the same sweep with `workdir: null`. Run it with:

    .venv/bin/python -m pytest tests/bench/test_bench_workdir.py -s -m bench
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from tests.fakecloud import BUCKET

pytestmark = pytest.mark.bench

MB = 20
UNPACKED = re.compile(rb"code \w+: (\d+) files, ([\d.]+) MB fetched and unpacked in ([\d.]+) s")


def sweep(orch, cloud, identity, name: str, workdir: str) -> object:
    return orch.sweep(
        cloud.sweep_yaml(
            name,
            identity,
            "true" if workdir == "null" else "test -f blob.bin",
            extra=f"grid:\n  i: [1, 2]\nmax_parallel: 2\nmax_restarts: 0\nresources:\n  gpus: 1\nworkdir: {workdir}\n",
            instance_types="[g5.12xlarge]",
        ),
        name=f"{name}.yaml",
    )


@pytest.mark.timeout(1300)
def test_a_20_mb_project_per_host_and_per_second_run(orch, cloud, identity):
    (orch.tmp / "blob.bin").write_bytes(os.urandom(MB * 1_000_000))
    times = {}
    for name, workdir in (("plain", "null"), ("withcode", ".")):
        path = sweep(orch, cloud, identity, name, workdir)
        t0 = time.perf_counter()
        r = orch("launch", str(path), timeout=600)
        times[name] = time.perf_counter() - t0
        assert r.code == 0, r.out[-2000:] + r.err[-2000:]
    s3 = cloud.client("s3")
    logs = [s3.get_object(Bucket=BUCKET, Key=f"sweeps/withcode/.orch/i={i}/logs/1.log")["Body"].read() for i in (1, 2)]
    fetched = [m for log in logs for m in UNPACKED.findall(log)]
    assert len(fetched) == 1, logs  # one host, one fetch
    files, mb, seconds = fetched[0]
    second = [log for log in logs if b"fetched and unpacked" not in log][0]
    record = json.loads(s3.get_object(Bucket=BUCKET, Key="sweeps/withcode/sweep.json")["Body"].read())
    t0 = time.perf_counter()
    from orchestrator.sweep.workdir import take

    take(orch.tmp, "bench", [orch.tmp / "cloud", orch.tmp / "orch-home"])
    snapshot_s = time.perf_counter() - t0
    figures = {
        "project_mb": MB,
        "archive_mb": round(record["code"]["archive_bytes"] / 1e6, 2),
        "snapshot_at_launch_s": round(snapshot_s, 2),
        "per_host_fetch_mb": float(mb),
        "per_host_fetch_and_unpack_s": float(seconds),
        "second_run_on_the_host": "fetched nothing" if b"already" in second or b"by another run" in second else "?",
        "launch_s_with_workdir": round(times["withcode"], 1),
        "launch_s_without": round(times["plain"], 1),
        "ratio": round(times["withcode"] / times["plain"], 2),
    }
    print(json.dumps(figures, indent=2))
    assert orch("down", "withcode").code == 0 and orch("down", "plain").code == 0
