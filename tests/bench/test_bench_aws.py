"""Benchmarks on the fake cloud (moto + loopback sshd hosts). Figures are printed; run with

    .venv/bin/python -m pytest tests/bench/test_bench_aws.py -s

(a) time from `orch launch` to every run's command started, for N = 1, 4, 16 runs (max_parallel N),
    and EC2 API calls per controller pass at N = 16 (counted on the backend's boto3 client);
(b) S3Store against `aws s3 sync` on the same moto server: 200 MB in 20 files, and a no-op
    re-sync of 1,000 unchanged files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from orchestrator.wait import retry_until
from tests.fakecloud import BUCKET

pytestmark = [pytest.mark.bench, pytest.mark.slow]


def all_running(orch, sweep, n):
    r = orch("status", sweep, "--json")
    if r.code != 0:
        return False
    runs = json.loads(r.out)["runs"]
    return len(runs) == n and all(x["state"] == "running" for x in runs)


@pytest.mark.timeout(1200)
def test_launch_time_scales_and_calls_per_pass_do_not(orch, cloud, identity, job):
    from orchestrator.backends.aws.backend import AwsBackend
    from orchestrator.backends.registry import load_sweep
    from orchestrator.control.controller import Controller
    from orchestrator.control.state import State
    from orchestrator.store import open_store

    figures = {}
    for n in (1, 4, 16):
        name = f"scale{n}"
        grid = "grid:\n  i: [" + ", ".join(str(i) for i in range(n)) + f"]\nmax_parallel: {n}\nmax_restarts: 0"
        path = orch.sweep(cloud.sweep_yaml(name, identity, job(steps=1, release=True), extra=grid), name=f"{name}.yaml")
        t0 = time.perf_counter()
        assert orch("launch", str(path), "--detach").code == 0
        retry_until(lambda: all_running(orch, name, n), 300, 0.2, f"{n} runs to start")
        figures[f"launch_to_all_started_s_N{n}"] = round(time.perf_counter() - t0, 2)
        print(f"\nN={n}: all started after {figures[f'launch_to_all_started_s_N{n}']} s", flush=True)
        assert orch("down", name, timeout=600).code == 0
        assert not any(cloud.leftovers(name).values())

    # count calls per pass with 16 live hosts: a fresh sweep, driven in this process
    name = "calls16"
    grid = "grid:\n  i: [" + ", ".join(str(i) for i in range(16)) + "]\nmax_parallel: 16\nmax_restarts: 0"
    path = orch.sweep(cloud.sweep_yaml(name, identity, job(steps=1, release=True), extra=grid), name="calls.yaml")
    os.environ.update(ORCH_HOME=str(orch.home))
    sweep = load_sweep(path)
    backend = AwsBackend(sweep)
    calls = []
    backend.ec2.meta.events.register("before-call.ec2.*", lambda model, **_: calls.append(model.name))
    controller = Controller(sweep, backend, open_store(sweep.store_url), State(orch.home))
    controller.prepare()
    retry_until(lambda: controller.step() and all_running(orch, name, 16), 300, 1.0, "16 runs to start in-process")
    calls.clear()
    for _ in range(5):
        controller.step()
    figures["ec2_calls_per_pass_N16"] = len(calls) / 5
    figures["ec2_call_kinds"] = sorted(set(calls))
    assert orch("down", name, timeout=600).code == 0
    figures["ratio_N16_vs_N1"] = round(
        figures["launch_to_all_started_s_N16"] / figures["launch_to_all_started_s_N1"], 2
    )
    print("\nfake-cloud launch benchmark:", json.dumps(figures))
    assert figures["ec2_calls_per_pass_N16"] == 1.0  # one DescribeInstances, whatever N
    assert not any(cloud.leftovers(name).values())


def _aws_cli_sync(src, url, env) -> float:
    t0 = time.perf_counter()
    subprocess.run(["aws", "s3", "sync", str(src), url, "--only-show-errors"], env=env, check=True)
    return time.perf_counter() - t0


@pytest.mark.skipif(shutil.which("aws") is None, reason="the aws CLI is not installed here (pip install awscli)")
def test_s3store_against_aws_s3_sync(tmp_path, cloud):
    from orchestrator.store.s3 import S3Store

    env = dict(os.environ, **cloud.env())
    big, many = tmp_path / "big", tmp_path / "many"
    big.mkdir()
    many.mkdir()
    for i in range(20):
        (big / f"shard-{i:02d}.bin").write_bytes(os.urandom(10 * 1024 * 1024))
    for i in range(1000):
        (many / f"f{i:04d}.txt").write_text(f"file {i}\n" * 20)

    store = S3Store(f"s3://{BUCKET}/ours", client=cloud.client("s3"))
    t0 = time.perf_counter()
    store.sync_up(big, "big")
    ours_big = time.perf_counter() - t0
    cli_big = _aws_cli_sync(big, f"s3://{BUCKET}/cli/big", env)

    store.sync_up(many, "many")
    _aws_cli_sync(many, f"s3://{BUCKET}/cli/many", env)
    fresh = S3Store(f"s3://{BUCKET}/ours", client=cloud.client("s3"))  # a new process: no hash cache yet
    t0 = time.perf_counter()
    noop = fresh.sync_up(many, "many")
    ours_noop = time.perf_counter() - t0
    cli_noop = _aws_cli_sync(many, f"s3://{BUCKET}/cli/many", env)
    assert noop.copied == 0 and noop.skipped == 1000

    figures = {
        "upload_200MB_20_files_s": {
            "s3store": round(ours_big, 2),
            "aws_s3_sync": round(cli_big, 2),
            "ratio": round(ours_big / cli_big, 2),
        },
        "noop_resync_1000_files_s": {
            "s3store": round(ours_noop, 3),
            "aws_s3_sync": round(cli_noop, 3),
            "ratio": round(ours_noop / cli_noop, 3),
        },
    }
    print("\nS3 sync benchmark:", json.dumps(figures))
