"""backends/aws/cloud/worth.py: a pool's expected dollars per unit of work from measured rates, reclaims and price;
exploration of a type never measured; the weights that make EC2's per-unit price choose as the ranking does."""

from __future__ import annotations

import pytest

from orchestrator.backends.aws.cloud import worth

PRICES = {("slow", "a"): 0.30, ("fast", "a"): 0.45, ("fast", "b"): 0.46}


def price_of(t: str, az: str) -> float | None:
    return PRICES.get((t, az))


def rank(measured, tried=None, ledger=None, now=10_000.0, loss_s=600.0):
    return worth.rank(list(PRICES), price_of, worth.rates(measured), tried or {}, ledger or {}, now, loss_s)


def ec2_choice(ranked) -> tuple[str, str]:
    """What EC2 takes with these weights: the lowest price per unit hour (the API reference's rule)."""
    w = worth.weights(ranked)
    return min(PRICES, key=lambda p: PRICES[p] / w[p])


def test_rates_are_summed_per_type_and_entries_that_are_not_numbers_are_passed_over():
    got = worth.rates(
        {
            "r#1": {"type": "fast", "work": 6, "seconds": 2},
            "r#2": {"type": "fast", "work": 3, "seconds": 1},
            "r#3": {"type": "slow", "work": "6", "seconds": 2},  # (the file is input)
            "r#4": {"type": "slow", "work": 1, "seconds": float("nan")},
            "r#5": ["not", "an", "entry"],
            "r#6": {"type": "slow", "work": True, "seconds": 1},
        }
    )
    assert got == {"fast": worth.Rate(3.0, 2, 3.0)}


def test_nothing_measured_ranks_by_price_and_weighs_every_pool_alike():
    ranked = rank({})
    assert [(w.instance_type, w.az) for w in ranked] == [("slow", "a"), ("fast", "a"), ("fast", "b")]
    assert set(worth.weights(ranked).values()) == {1.0}
    assert ec2_choice(ranked) == ("slow", "a")


def test_an_unmeasured_type_is_tried_first_then_the_lower_dollars_per_unit_wins():
    slow_only = {"x#1": {"type": "slow", "work": 1, "seconds": 1}}
    ranked = rank(slow_only, tried={"slow": 1})
    assert ranked[0].instance_type == "fast" and "tried first" in ranked[0].note
    assert ec2_choice(ranked) == ("fast", "a")  # the cheaper fast pool is explored
    both = {**slow_only, "x#2": {"type": "fast", "work": 3, "seconds": 1}}
    ranked = rank(both, tried={"slow": 1, "fast": 1})
    assert ranked[0].instance_type == "fast" and ranked[0].note == "measured (1 attempt)"
    assert ec2_choice(ranked) == ("fast", "a")  # $0.45 for 3 units beats $0.30 for 1
    assert ranked[0].per_unit == pytest.approx(0.45 / (3 * 3600) * (1 + ranked[0].reclaims_per_h * 600 / 3600))


def test_a_type_still_unmeasured_after_its_attempts_is_ranked_as_the_slowest():
    slow_only = {"x#1": {"type": "slow", "work": 1, "seconds": 1}}
    ranked = rank(slow_only, tried={"slow": 1, "fast": worth.EXPLORE})
    fast = next(w for w in ranked if w.instance_type == "fast")
    assert fast.rate == pytest.approx(3600) and "ranked as the slowest" in fast.note
    assert ec2_choice(ranked) == ("slow", "a")


def test_a_pool_reclaimed_often_loses_its_rank_and_a_fresh_reclaim_in_an_az_weighs_for_minutes():
    both = {"x#1": {"type": "fast", "work": 1, "seconds": 1}, "x#2": {"type": "slow", "work": 1, "seconds": 3}}
    # fast in a: reclaimed 5 times in 2 hours; fast in b: none
    ledger = {f"i-{k}": {"type": "fast", "az": "a", "start": 0, "end": 1440, "reclaimed": 1440} for k in range(5)}
    ranked = rank(both, tried={"fast": 5, "slow": 5}, ledger=ledger, now=1_000_000)
    fast = {w.az: w for w in ranked if w.instance_type == "fast"}
    assert fast["a"].reclaims_per_h > 1.5 > 0.2 > fast["b"].reclaims_per_h
    assert ec2_choice(ranked) == ("fast", "b")  # a cent dearer by the hour, cheaper by the unit
    calm = {"i-1": {"type": "fast", "az": "a", "start": 0, "end": 36_000}}
    just = {"i-1": {**calm["i-1"], "reclaimed": 9_900.0}}
    assert worth.rank([("fast", "a")], price_of, {}, {}, just, 10_000.0, 600)[0].reclaims_per_h > 4
    later = worth.rank([("fast", "a")], price_of, {}, {}, just, 10_000.0 + worth.CLUSTER_S, 600)[0].reclaims_per_h
    assert later < 0.5  # the cluster is over (the one reclaim in 10 h remains)


def test_the_smallest_weight_is_one_so_ec2_prices_per_unit_for_a_one_instance_request():
    measured = {"x#1": {"type": "fast", "work": 3, "seconds": 1}, "x#2": {"type": "slow", "work": 1, "seconds": 1}}
    w = worth.weights(rank(measured, tried={"fast": 1, "slow": 1}))
    assert min(w.values()) == 1.0 and w[("fast", "a")] == pytest.approx(3.0, rel=0.01)


def test_boot_and_checkpoints_make_the_loss_of_a_reclaim():
    assert worth.loss_seconds([], 600) == 300 + worth.BOOT_S
    assert worth.loss_seconds([60, 100, 80], 1200) == 600 + 80


def test_units_per_run_sum_each_runs_attempts_over_this_and_earlier_sweeps_and_pass_over_what_is_not_work():
    own = {"a#1": {"work": 3.0}, "a#2": {"work": 2.0}, "b#1": {"work": 9.0}, "c#1": {"work": "x"}, "d#1": [1]}
    earlier = {"old/a#1": {"work": 4.0}, "old/e#1": {"work": float("nan")}}
    assert worth.units_per_run(own, earlier) == (5.0, 3)  # a: 5, b: 9, old/a: 4 -> the median 5
    assert worth.units_per_run({}, {}) is None
