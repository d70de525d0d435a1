"""The aws backend's `orch launch --dry-run` in words (the registry's `plan_lines`): where the sweep may run, its
image, each (type, AZ) choice with its price and shape, the packing, the cost bound over the allowed regions and what
moving data between regions would cost. Builds lines from `plan()`'s dict, never prints."""

from __future__ import annotations

from orchestrator.backends.aws.cloud.pricing import GB, REGION_UPLIFT
from orchestrator.money import usd
from orchestrator.sweep.shapes import describe
from orchestrator.sweep.spec import Sweep


def plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    """The plan's part of the dry run, after the runs and before the sweep's goals."""
    lines = [region_line(plan), f"image {plan['image_asked']}: {plan['image']}"]
    for row in plan["choices"]:
        lines.append(
            f"  choice {row['type']} in {row['az']}: {_choice_price(row)}; each run there: "
            f"{describe(sweep.spec.resources, row['gpus'])}"
        )
    lines += plan.get("packing") or []
    return lines + worth_lines(plan.get("worth") or {}) + bound_lines(plan)


def worth_lines(worth: dict) -> list[str]:
    """How the pools rank (cloud/worth.py): by expected $ per unit of work, or by the hour (`aws.choose: price`)."""
    if worth.get("choose") != "work":
        return ["pools: ranked by EC2 by the hour (aws.choose: price)"]
    pools, key = worth.get("pools") or [], worth.get("work_key", "epoch")
    measured = any(p.rate is not None for p in pools)
    unit = key if measured else "useful hour"
    head = (
        f"pools, by expected $ per {key} (aws.choose: work; EC2 takes the best it has capacity in):"
        if measured
        else f"pools, by $ per useful hour (no {key} rate measured yet: each type's first attempts measure it; "
        "aws.choose: work):"
    )
    out = [head]
    for k, p in enumerate(pools, start=1):
        price = f"${p.price:.4f}/h" if p.price is not None else "no price"
        rate = f"{p.rate:.3g} {key}/h, {p.note}" if p.rate is not None else p.note
        cost = f"${p.per_unit:.4g}/{unit}" if p.per_unit is not None else "not ranked"
        out.append(f"  {k}. {p.instance_type} in {p.az}: {cost} ({price}; {rate}; {p.reclaims_per_h:.2f} reclaims/h)")
    out.append(f"  spot placement scores: {worth.get('scores') or 'not asked'}")
    sweeps = worth.get("earlier") or []
    if sweeps:
        out.append(f"  rates measured in earlier sweeps of this command count too: {', '.join(sweeps)}")
    return out


def region_line(plan) -> str:
    """Where the sweep may run, and its home (docs/guides/regions.md)."""
    regions, home = plan.get("regions") or [], plan.get("home_region")
    which = f"regions {', '.join(regions)} (asked in this order)" if len(regions) > 1 else f"region {regions[0]}"
    return f"{which}; home region {home} (the store's bucket: results and a --remote controller live there)"


def _choice_price(row: dict) -> str:
    price = f"${row['spot_usd_per_h']:.4f}/h" if row["spot_usd_per_h"] is not None else "no spot price"
    if row.get("on_demand_priced") and row.get("usd_per_h") is not None:
        price += f", at most ${row['usd_per_h']:.4f}/h on demand ({row['on_demand_priced']})"
    return price


def bound_lines(plan: dict) -> list[str]:
    """The cost bound (the dearest hour of any choice, in any allowed region) and the inter-region transfer."""
    est = plan["estimate_usd_max"]
    per = f" x {plan['nodes_per_run']} instances" if plan.get("nodes_per_run", 1) > 1 else ""
    h = plan["hours_per_run_max"]
    each = f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"
    unpriced = plan.get("unpriced_choices") or 0
    regions = sorted({row.get("region", "") for row in plan["choices"]} - {""})
    where = f" in {', '.join(regions)}" if len(regions) > 1 else ""
    hour = "spot price" if plan.get("market", "spot") == "spot" else f"{plan['market']} price"
    bound = usd(est, at_most=True) if est is not None else ""
    lines = [
        f"estimated cost at most {bound} ({plan['runs']} runs{per} x {each} at the dearest {hour} of the "
        f"choices{where}, each region at its own prices; runs that end sooner cost less"
        + (f"; {unpriced} choice(s) without a price are not in this bound" if unpriced else "")
        + ")"
        if est is not None
        else "estimated cost unknown: no spot price history"
    ]
    lines += _deadline_share(plan) + _expected(plan)
    for region in plan.get("uplifted") or []:
        lines.append(
            f"  {region}: no published on-demand prices in orch's table; priced at us-east-1's x {REGION_UPLIFT} "
            "(an upper estimate: orchestrator/backends/aws/cloud/pricing.py ON_DEMAND_BY_REGION takes the region's "
            "own figures)"
        )
    return lines + transfer_lines(plan.get("transfer"))


def _expected(plan: dict) -> list[str]:
    """`aws.choose: work`, once runs of the command were measured: what the sweep is expected to cost at the best pool's
    expected $ per unit (cloud/worth.py) — an estimate beside the bound, which holds whatever is measured."""
    worth, per_run = plan.get("worth") or {}, (plan.get("worth") or {}).get("per_run")
    best = next((p for p in worth.get("pools") or [] if p.rate is not None and p.per_unit is not None), None)
    if not per_run or best is None:
        return []
    units, measured = per_run
    key, runs = worth.get("work_key", "epoch"), plan["runs"]
    return [
        f"  expected about {usd(runs * units * best.per_unit)}: {runs} run(s) x ~{units:.3g} {key} each (the median of "
        f"{measured} measured run(s) of this command) at the best pool's ${best.per_unit:.4g} per {key}, reclaims' "
        "expected loss included; an estimate, where the bound holds whatever is measured"
    ]


def _deadline_share(plan: dict) -> list[str]:
    """`deadline:` with market spot: the bound is every hour on on-demand (spot gone from the launch on); how much of it
    is the on-demand share, bought only when the schedule needs it (control/schedule.py)."""
    est, spot = plan.get("estimate_usd_max"), plan.get("estimate_spot_usd_max")
    if est is None or spot is None:
        return []
    share = max(0.0, est - spot)
    return [
        f"  with the deadline: at most {usd(spot, at_most=True)} if spot holds throughout (every hour at the dearest "
        f"spot price); the on-demand share, up to {usd(share, at_most=True)} ({share / est:.0%} of the bound), is "
        "bought only from the switch moment or for a run a reclaim would make late"
    ]


def transfer_lines(t: dict | None) -> list[str]:
    """What data moved between the store's region and runs elsewhere would cost (AWS's inter-region rates)."""
    if not t:
        return []
    if not t["rates"]:
        return [f"transfer: none across regions (the store and every run are in {t['home']})"]
    size = t.get("data_bytes")
    data = f"`data:` is {size / GB:.3f} GB per host" if size is not None else "`data:` size unknown to orch"
    out = [f"transfer: the store is in {t['home']} (home); a run in another region pays AWS's inter-region rate:"]
    for region, rate in t["rates"].items():
        staged = f", its `data:` ~{usd(size / GB * rate['down'])} per host" if size else ""
        out.append(
            f"  {region}: ${rate['up']:.2f}/GB up (checkpoints, metrics, logs), ${rate['down']:.2f}/GB down "
            f"(restores, `data:` staging){staged}"
        )
    out.append(f"  ({data}; checkpoints are priced per GB: their size is not known before the runs write them)")
    return out
