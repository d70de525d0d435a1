"""Money across regions through the CLI (docs/guides/costs.md): each attempt's region in `orch status` and `orch
collect`, the bytes moved across regions priced in `orch collect`, and what `orch launch --dry-run` says of prices
per region and of transfer."""

from __future__ import annotations

import csv
import json
import math

import pytest

from orchestrator.backends.aws.cloud import pricing
from orchestrator.backends.aws.cloud.pricing import GB, CostLedger, PriceBook
from orchestrator.backends.aws.state import spot_prices_by_region
from orchestrator.store.status import RunStatus, write_status
from tests.fakecloud import BUCKET
from tests.fakecloud.cloud import IMAGE_NAME

pytestmark = pytest.mark.slow


@pytest.fixture
def aws_env(cloud, monkeypatch):
    """This process as the controller on the fake cloud (its credentials and endpoint)."""
    for k, v in cloud.env().items():
        monkeypatch.setenv(k, v)
    return cloud


def _ledger(store, sweep: str) -> CostLedger:
    return CostLedger(store, sweep, PriceBook(lambda t, a: spot_prices_by_region(t, a, "us-east-1")), home="us-east-1")


def _runs_in_two_regions(cloud, orch, identity, tmp_path):
    """A sweep of two runs whose ledger and records say: a=1 ran attempt 1 in us-east-1 (home) and attempt 2 in
    us-west-2, moving `up` and `down` bytes there; a=2 ran once at home."""
    from orchestrator.store import open_store

    path = orch.sweep(cloud.sweep_yaml("regional", identity, "true", extra="grid:\n  a: [1, 2]"))
    store = open_store(f"s3://{BUCKET}/sweeps")
    ledger = _ledger(store, "regional")
    ledger.acquired("i-a", "g5.xlarge", "us-east-1a", "spot", run="a=1", gpus=1, attempt=1)
    ledger.acquired("i-b", "g5.xlarge", "us-west-2a", "spot", run="a=1", gpus=1, attempt=2)
    ledger.acquired("i-c", "g6.xlarge", "us-east-1b", "spot", run="a=2", gpus=1, attempt=1)
    up, down = 3 * GB // 2, GB // 4
    moved = {"a=1": {"1": [GB, GB], "2": [up, down]}, "a=2": {"1": [GB // 2, 0]}}
    for run, attempts in moved.items():
        state = "succeeded" if run == "a=2" else "running"
        write_status(store, "regional", RunStatus(run_id=run, state=state, attempt=len(attempts), moved=attempts))
    return path, up, down


def test_collect_shows_each_attempts_region_and_prices_the_bytes_moved_across_regions(
    aws_env, orch, identity, tmp_path
):
    path, up, down = _runs_in_two_regions(aws_env, orch, identity, tmp_path)
    r = orch("collect", str(path), "--out", str(tmp_path / "out"), "--wide")
    assert r.code == 0, r.out + r.err
    rows = {row["run_id"]: row for row in csv.DictReader(open(tmp_path / "out" / "runs.csv"))}
    assert rows["a=1"]["region"] == "us-east-1,us-west-2" and rows["a=2"]["region"] == "us-east-1"
    # attempt 1 ran at home (free); attempt 2's uploads leave us-west-2, its downloads leave us-east-1: $0.02/GB each
    want = (up + down) / GB * 0.02
    assert float(rows["a=1"]["transfer_usd"]) == pytest.approx(want, abs=1e-4)
    assert float(rows["a=1"]["transfer_gb"]) == pytest.approx((up + down) / GB, abs=1e-4)
    assert float(rows["a=2"]["transfer_usd"]) == 0.0
    doc = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert doc["transfer_usd"] == pytest.approx(want, abs=1e-4)
    assert "region" in r.out and "us-west-2" in r.out and "transfer $" in r.out, r.out
    assert f"inter-region transfer: ${want:.4f}" in r.out, r.out


def test_status_shows_the_region_of_each_runs_current_attempt(aws_env, orch, identity, tmp_path):
    path, _, _ = _runs_in_two_regions(aws_env, orch, identity, tmp_path)
    r = orch("status", str(path), "--json")
    assert r.code == 0, r.err
    runs = {run["run_id"]: run for run in json.loads(r.out)["runs"]}
    assert runs["a=1"]["region"] == "us-west-2" and runs["a=2"]["region"] == "us-east-1"
    table = orch("status", str(path))
    assert table.code == 0 and "region" in table.out and "us-west-2" in table.out, table.out


def test_a_param_named_region_keeps_its_own_column(tmp_path):
    from orchestrator.control.collect import param_column

    assert param_column("region") == "param.region" and param_column("transfer_usd") == "param.transfer_usd"


def test_the_dry_run_prices_on_demand_hours_per_region_and_names_the_transfer(orch, cloud, identity):
    text = cloud.sweep_yaml("odbound", identity, "true", extra="timeout_minutes: 60", market="on-demand")
    r = orch("launch", str(orch.sweep(text)), "--dry-run")
    assert r.code == 0, r.out + r.err
    published = pricing.ON_DEMAND_USD_PER_H["g5.xlarge"]
    assert f"at most ${published:.4f}/h on demand (published)" in r.out, r.out
    assert "at the dearest on-demand price of the choices" in r.out, r.out
    assert "estimated cost at most $1.01 " in r.out, r.out  # one run x 1 h x g5.xlarge's published hour (the dearer)
    assert "transfer: none across regions (the store and every run are in us-east-1)" in r.out, r.out


def test_the_dry_run_bounds_the_cost_over_every_region_and_prices_the_transfer_per_gb(orch, cloud, identity, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "shard.bin").write_bytes(b"d" * (GB // 64))  # 16 MiB, pushed with orch's own index
    assert orch("data", "push", str(data), f"s3://{BUCKET}/datasets/shards/").code == 0
    extra = f"timeout_minutes: 60\ndata:\n  - from: s3://{BUCKET}/datasets/shards/\n    to: shards"
    text = cloud.sweep_yaml("farbound", identity, "true", extra=extra, market="on-demand")
    cloud.register_image(IMAGE_NAME, region="eu-west-1")  # every listed region must have the image
    path = orch.sweep(text.replace("  region: us-east-1\n", "  regions: [us-east-1, eu-west-1]\n"))
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 0, r.out + r.err
    uplifted = pricing.ON_DEMAND_USD_PER_H["g5.xlarge"] * pricing.REGION_UPLIFT
    # the dearest hour is g5.xlarge on demand in eu-west-1 (no table there: us-east-1's x REGION_UPLIFT)
    assert f"estimated cost at most ${math.ceil(uplifted * 100) / 100:.2f} " in r.out, r.out  # a bound rounds up
    assert "choices in eu-west-1, us-east-1, each region at its own prices" in r.out, r.out
    assert f"at most ${uplifted:.4f}/h on demand (uplift)" in r.out, r.out
    assert (
        f"eu-west-1: no published on-demand prices in orch's table; priced at us-east-1's x {pricing.REGION_UPLIFT}"
        in r.out
    )
    assert "transfer: the store is in us-east-1 (home)" in r.out, r.out
    assert "eu-west-1: $0.02/GB up (checkpoints, metrics, logs), $0.02/GB down (restores, `data:` staging)" in r.out
    assert "`data:` is 0.016 GB per host" in r.out, r.out
