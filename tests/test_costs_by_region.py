"""Money across regions (docs/guides/costs.md): prices per region, the cost ledger per attempt with its region, the
bytes an agent moves to and from the store, inter-region transfer priced in `orch collect`, each attempt's region in
`orch status` and `orch collect`, and what `orch launch --dry-run` says of both."""

from __future__ import annotations

import csv
import json

import pytest

from orchestrator.aws import pricing
from orchestrator.aws.pricing import GB, CostLedger, PriceBook, ledger_cost, region_of_az
from orchestrator.backends.aws.state import spot_prices_by_region
from orchestrator.store.status import RunStatus, read_status, write_status
from orchestrator.wait import retry_until
from tests.fakecloud import BUCKET
from tests.fakecloud_gate import spot_price


@pytest.mark.parametrize(
    "az, region",
    [
        ("us-east-1a", "us-east-1"),
        ("us-west-2b", "us-west-2"),
        ("us-west-2-lax-1a", "us-west-2"),  # a Local Zone belongs to its parent region
        ("us-east-1-wl1-bos-wlz-1", "us-east-1"),  # a Wavelength Zone too
        ("us-gov-west-1a", "us-gov-west-1"),
        ("ap-northeast-1c", "ap-northeast-1"),
        ("", ""),
    ],
)
def test_an_availability_zone_names_the_region_it_belongs_to(az, region):
    assert region_of_az(az) == region


def test_on_demand_hours_are_priced_by_the_regions_own_table_and_a_missing_region_errs_high():
    published = pricing.ON_DEMAND_USD_PER_H["g5.xlarge"]
    assert pricing.on_demand_quote("g5.xlarge", None, "us-west-2") == (published, "published")
    price, how = pricing.on_demand_quote("g5.xlarge", None, "eu-west-1")
    assert how == "uplift" and price == pytest.approx(published * pricing.REGION_UPLIFT) and price > published
    # a type no table knows: from that region's own spot price, in any region
    assert pricing.on_demand_quote("x9.huge", 0.5, "eu-west-1") == (0.5 * pricing.ON_DEMAND_FACTOR, "spot")
    assert pricing.on_demand_quote("x9.huge", None, "eu-west-1") == (None, "unknown")


def test_transfer_is_billed_at_the_rate_of_the_region_the_bytes_leave():
    assert pricing.transfer_rate("us-east-1", "us-east-1") == 0.0  # within a region: free
    assert pricing.transfer_rate("us-west-2", "us-east-1") == 0.02
    assert pricing.transfer_rate("us-east-1", "us-east-2") == 0.01  # the pair AWS lists apart
    assert pricing.transfer_rate("ap-south-2", "us-east-1") == pricing.TRANSFER_FALLBACK_USD_PER_GB


@pytest.fixture
def aws_env(cloud, monkeypatch):
    """This process as the controller on the fake cloud (its credentials and endpoint)."""
    for k, v in cloud.env().items():
        monkeypatch.setenv(k, v)
    return cloud


def test_spot_prices_come_from_each_azs_own_region(aws_env):
    got = spot_prices_by_region(["g5.xlarge"], ["us-east-1a", "us-west-2a"], "us-east-1")
    assert got == {
        ("g5.xlarge", "us-east-1a"): spot_price("g5.xlarge", "us-east-1a"),
        ("g5.xlarge", "us-west-2a"): spot_price("g5.xlarge", "us-west-2a"),
    }
    assert got[("g5.xlarge", "us-east-1a")] != got[("g5.xlarge", "us-west-2a")]


def _ledger(store, sweep: str) -> CostLedger:
    return CostLedger(store, sweep, PriceBook(lambda t, a: spot_prices_by_region(t, a, "us-east-1")), home="us-east-1")


def test_a_ledger_of_attempts_in_two_regions_is_instance_hours_times_each_regions_price(aws_env, tmp_path):
    from orchestrator.store.folder import LocalStore

    ledger = _ledger(LocalStore(tmp_path / "store"), "two")
    ledger.acquired("i-1", "g5.xlarge", "us-east-1b", "spot", run="r", gpus=1, attempt=1)
    ledger.acquired("i-2", "g5.xlarge", "eu-west-1a", "on-demand", run="r", gpus=1, attempt=2)
    ledger.acquired("i-3", "g6.xlarge", "us-west-2a", "spot", run="q", gpus=1, attempt=1)
    entries = ledger.entries
    retry_until(
        lambda: ledger.observe(["i-1", "i-2", "i-3"]) or entries["i-1"]["end"] > entries["i-1"]["start"],
        10,
        0.05,
        "the instances to be seen running a while",
    )
    want = {
        "i-1": ("us-east-1", spot_price("g5.xlarge", "us-east-1b")),
        "i-2": ("eu-west-1", pricing.ON_DEMAND_USD_PER_H["g5.xlarge"] * pricing.REGION_UPLIFT),
        "i-3": ("us-west-2", spot_price("g6.xlarge", "us-west-2a")),
    }
    for iid, (region, price) in want.items():
        assert entries[iid]["region"] == region and entries[iid]["home"] == "us-east-1"
        assert entries[iid]["price_per_h"] == pytest.approx(price)
    seconds = {iid: e["end"] - e["start"] for iid, e in entries.items()}
    assert ledger_cost(entries) == pytest.approx(sum(seconds[i] / 3600 * p for i, (_, p) in want.items()))
    assert pricing.attempt_regions(entries) == {"r": {1: "us-east-1", 2: "eu-west-1"}, "q": {1: "us-west-2"}}


def test_the_agent_counts_the_bytes_each_attempt_moved_to_the_store(orch, script):
    blob = 3 * 1024 * 1024
    job = script(f"""
        import os
        open(os.path.join(os.environ["ORCH_RUN_DIR"], "ckpt.bin"), "wb").write(b"x" * {blob})
    """)
    path = orch.sweep(f"""
        name: moved
        command: "{{python}} {job}"
        store: store
    """)
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    from orchestrator.store.folder import LocalStore

    status = read_status(LocalStore(path.parent / "store"), "moved", "run")
    up, down = status.moved["1"]
    assert blob <= up < blob + 64 * 1024 and down == 0, status.moved  # the file, plus the log and the sync index


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
