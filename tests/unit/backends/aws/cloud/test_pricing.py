"""Prices and the cost ledger per region (orchestrator/backends/aws/cloud/pricing.py; docs/guides/costs.md): an AZ's
region, on-demand hours from the region's own table (a region missing from it priced high), inter-region transfer
rates, spot prices from each region's own history, and a ledger of attempts in two regions."""

from __future__ import annotations

import pytest

from orchestrator.backends.aws.cloud import pricing
from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook, ledger_cost, region_of_az
from orchestrator.backends.aws.state import spot_prices_by_region
from orchestrator.wait import retry_until
from tests.fakecloud.gate import spot_price


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


def test_runs_sharing_instances_in_two_regions_keep_each_attempts_region_and_transfer(aws_env, tmp_path):
    """A shared instance's entry names no run: its slots say which run's attempt held it (`orch status`, `orch collect`
    and the transfer read each attempt's region from there)."""
    from orchestrator.store.folder import LocalStore

    ledger = _ledger(LocalStore(tmp_path / "store"), "packed")
    ledger.acquired("i-west", "g5.12xlarge", "us-west-2a", "spot", gpus=4, slots=4)
    ledger.observe(["i-west"], {"i-west": [("a", 1), ("b", 1)]})
    ledger.acquired("i-east", "g5.12xlarge", "us-east-1a", "spot", gpus=4, slots=4)
    ledger.observe(["i-east"], {"i-east": [("a", 2), ("b", 2)]})
    ledger.observe(["i-east"], {"i-east": [("a", 2), ("b", 3)]})  # b's attempt 3 on the same instance
    entries = ledger.entries
    assert pricing.attempt_regions(entries) == {
        "a": {1: "us-west-2", 2: "us-east-1"},
        "b": {1: "us-west-2", 2: "us-east-1", 3: "us-east-1"},
    }
    gb = pricing.GB
    usd, crossed = pricing.transfer_usd(entries, "a", {"1": [gb, 0], "2": [gb, 0]})
    assert (usd, crossed) == (pytest.approx(pricing.transfer_rate("us-west-2", "us-east-1")), gb)  # attempt 1 only
