"""Buying work, not hours: what one unit of work is expected to cost in each pool (docs/guides/costs.md).

A pool is (instance type, AZ). Its expected dollars per unit of work:

    $/unit = (price per hour + transfer per hour) / (units per hour) x (1 + reclaims per hour x hours lost per reclaim)

- **units per hour**: measured from the sweep's own attempts on that type (their metrics lines: work key per second
  of `elapsed_s`), summed over attempts. A type never measured is neither trusted nor ignored: once some type is
  measured, one that has had fewer than EXPLORE attempts is ranked just ahead of the best measured pool (the cheapest
  by the hour first), so its next attempt measures it — at most EXPLORE attempts; after that, still unmeasured, it is
  ranked at the slowest measured rate. With no measurement at all, every rate is equal: the
  ranking is by price, less what each pool's reclaims are expected to lose ($ per useful hour).
- **reclaims per hour**: reclaims (and lost hosts) per instance-hour of that pool in the sweep's ledger and earlier
  sweeps' in the store, with a prior of PRIOR_RECLAIMS reclaims in PRIOR_HOURS hours (a pool seen for minutes is not
  judged on one event) — moved by AWS's Spot placement score for the AZ where had (prior_per_h); plus, for
  CLUSTER_S after a reclaim anywhere in the same AZ, CLUSTER_PER_H more, decaying linearly: reclaims cluster in a zone
  for minutes (SpotHedge, EuroSys'25: another reclaim in the same zone within 5 minutes 83-97% of the time) while
  regions are nearly independent (nothing carries across regions).
- **transfer**: a pool outside the store's region adds its inter-region transfer to its price per hour: the bytes an
  hour the sweep's hosts moved up to the store and down from it (measured per attempt), at AWS's rates each way.
- **hours lost per reclaim**: half the time between checkpoints (the work since the last one, on average) plus the
  measured boot and restore of the sweep's attempts (default BOOT_S until one was measured).

EC2 chooses among CreateFleet's overrides by its allocation strategy, never by their order. With weights
(`WeightedCapacity`), "the price used in the lowestPrice and priceCapacityOptimized allocation strategies is per unit
hour (where the instance price is divided by the specified weight)" unless every weight is above the target capacity
(EC2 API reference, FleetLaunchTemplateOverridesRequest). So each override's weight is its pool's effective rate,
scaled so that the smallest is exactly 1 (the target capacity of a one-instance request): EC2 then takes the lowest
$/unit among the pools it has capacity in. Pure functions; docs/aws.md cites the sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median

EXPLORE = 2  # attempts an unmeasured type is tried first (to measure it) before it is ranked as the slowest
PRIOR_RECLAIMS, PRIOR_HOURS = 0.1, 1.0  # a pool with no history: 0.1 reclaims per hour
CLUSTER_S = 300.0  # after a reclaim in an AZ, its pools are expected to lose more for this long
CLUSTER_PER_H = 6.0  # reclaims per hour added at once after a reclaim in the AZ, falling to 0 over CLUSTER_S
BOOT_S = 180.0  # boot and restore, until the sweep measured its own
CHECKPOINT_S = 600.0  # seconds between checkpoints (half of it is lost on average) when the sweep does not say
DEFAULT_WORK_KEY = "epoch"
SCORE_MID = 5  # a placement score this high keeps the prior as it is (prior_per_h)


@dataclass(frozen=True)
class Rate:
    """A type's measured work rate."""

    per_s: float  # units of work per second
    attempts: int  # attempts it rests on
    seconds: float  # seconds of work measured
    earlier: int = 0  # of its attempts, those of earlier sweeps of the same command (backends/aws/earlier.py)


def rates(measured: dict[str, dict], earlier: dict[str, dict] | None = None) -> dict[str, Rate]:
    """Per instance type, from `rates.json`'s attempts ("run#attempt" -> {type, work, seconds}) and earlier sweeps'
    of the same command: summed work over summed seconds. An entry that is not numbers is passed over (input)."""
    own = _sums(measured)
    before = _sums(earlier or {})
    out = {}
    for t in own.keys() | before.keys():
        w, sec, n = (a + b for a, b in zip(own.get(t, [0.0, 0.0, 0]), before.get(t, [0.0, 0.0, 0])))
        out[t] = Rate(w / sec, int(n), sec, int(before.get(t, [0, 0, 0])[2]))
    return out


def _sums(measured: dict[str, dict]) -> dict[str, list[float]]:
    sums: dict[str, list[float]] = {}
    for entry in measured.values():
        if not isinstance(entry, dict):
            continue
        itype, work, seconds = entry.get("type"), entry.get("work"), entry.get("seconds")
        if not isinstance(itype, str) or not _positive(work) or not _positive(seconds):
            continue
        s = sums.setdefault(itype, [0.0, 0.0, 0])
        s[0], s[1], s[2] = s[0] + float(work), s[1] + float(seconds), s[2] + 1  # type: ignore[operator]
    return sums


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and 0 < x < float("inf")


@dataclass(frozen=True)
class Reclaims:
    """A pool's history in the sweep's ledger."""

    count: int  # instances of the pool reclaimed (or lost)
    hours: float  # instance-hours the pool ran


def history(entries: dict[str, dict]) -> tuple[dict[tuple[str, str], Reclaims], dict[str, float]]:
    """Per pool (type, AZ): reclaims and hours; per AZ: the newest reclaim's time. From the cost ledger's entries."""
    pools: dict[tuple[str, str], list[float]] = {}
    newest: dict[str, float] = {}
    for e in entries.values():
        if not isinstance(e, dict) or e.get("role") or not isinstance(e.get("type"), str):
            continue
        start, end, when, az = (
            _number(e.get("start")),
            _number(e.get("end")),
            _number(e.get("reclaimed")),
            str(e.get("az", "")),
        )
        p = pools.setdefault((e["type"], az), [0, 0.0])
        p[1] += max(0.0, end - start) / 3600 if start is not None and end is not None else 0.0
        if when is not None:
            p[0] += 1
            newest[az] = max(newest.get(az, 0.0), when)
    return {k: Reclaims(int(c), h) for k, (c, h) in pools.items()}, newest


def _number(x) -> float | None:
    """x as a float when it is a finite number (the ledger is input), else None."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) < float("inf")
    return float(x) if ok else None


def prior_per_h(score: int | None) -> float:
    """Reclaims per hour a pool is expected to have before its own history: PRIOR_RECLAIMS, or with AWS's Spot
    placement score for its AZ (cloud/scores.py) halved for every 2 points above SCORE_MID and doubled for every 2
    below (10: 0.018/h, 5: 0.1/h, 1: 0.4/h)."""
    return PRIOR_RECLAIMS if score is None else PRIOR_RECLAIMS * 2 ** ((SCORE_MID - score) / 2)


def reclaims_per_h(pool: Reclaims | None, az_newest: float | None, now: float, score: int | None = None) -> float:
    """The pool's expected reclaims per hour: its history over a prior (the AZ's placement score's, when had), plus
    the AZ's recent reclaim, decaying."""
    count, hours = (pool.count, pool.hours) if pool else (0, 0.0)
    rate = (count + prior_per_h(score) * PRIOR_HOURS) / (hours + PRIOR_HOURS)
    if az_newest is not None and 0 <= now - az_newest < CLUSTER_S:
        rate += CLUSTER_PER_H * (1 - (now - az_newest) / CLUSTER_S)
    return rate


@dataclass(frozen=True)
class PoolWorth:
    """One pool, as `--dry-run` lists it and CreateFleet weighs it."""

    instance_type: str
    az: str
    price: float | None  # $/h in the market asked
    transfer_per_h: float  # $/h of inter-region transfer expected in the pool's region (0 in the home region)
    rate: float | None  # units per hour it is ranked at (None: no type measured, ranked by price)
    measured: Rate | None  # the type's own measurement (None: not measured)
    reclaims_per_h: float
    loss_h: float  # hours of work lost per reclaim
    per_unit: float | None  # expected $ per unit of work (None: no rate, or no price)
    note: str  # how its rate was had: "measured (N attempts)", "not measured: tried at the best rate", ...

    @property
    def effective(self) -> float:
        """Units per hour, less what reclaims are expected to lose (no type measured: of an hour's work, 1), and less
        the transfer's share of the pool's dollars (EC2 divides the instance price alone by the weight)."""
        rate = (1.0 if self.rate is None else self.rate) / (1 + self.reclaims_per_h * self.loss_h)
        price = self.price or 0.0
        return rate * price / (price + self.transfer_per_h) if price > 0 else rate


def assumed_rate(itype: str, measured: dict[str, Rate], tried: dict[str, int]) -> tuple[float | None, str]:
    """(units per hour, note) a type is ranked at: its own; None to be explored (ranked first, see rank()); with no
    measurement at all, None (every type alike); after EXPLORE attempts without one, the slowest measured rate."""
    own = measured.get(itype)
    if own is not None:
        before = f", {own.earlier} in earlier sweeps" if own.earlier else ""
        return own.per_s * 3600, f"measured ({own.attempts} attempt{'s' if own.attempts != 1 else ''}{before})"
    if not measured:
        return None, "not measured"
    if tried.get(itype, 0) < EXPLORE:
        return None, f"not measured: tried first, to measure it (at most {EXPLORE} attempts)"
    return min(r.per_s for r in measured.values()) * 3600, f"not measured in {EXPLORE} attempts: ranked as the slowest"


def rank(
    pools: list[tuple[str, str]],
    price_of: Callable[[str, str], float | None],
    measured: dict[str, Rate],
    tried: dict[str, int],
    ledger: dict[str, dict],
    now: float,
    loss_s: float,
    scores: dict[str, int] | None = None,
    transfer_of: Callable[[str], float] | None = None,
) -> list[PoolWorth]:
    """Every pool's worth, best (lowest expected $ per unit) first; pools without a price last. `scores`: AWS's
    placement score per AZ, where had (cloud/scores.py)."""
    pool_history, az_newest = history(ledger)
    loss_h, out, scores = loss_s / 3600, [], scores or {}
    for itype, az in pools:
        rate, note = assumed_rate(itype, measured, tried)
        score = scores.get(az)
        note += f"; placement score {score}" if score is not None else ""
        lam = reclaims_per_h(pool_history.get((itype, az)), az_newest.get(az), now, score)
        price, moving = price_of(itype, az), transfer_of(az) if transfer_of else 0.0
        note += f"; +${moving:.4f}/h transfer" if moving else ""
        # no type measured: every rate alike (1 unit an hour), so the ranking is by price, less what reclaims lose
        per_unit = None if price is None else (price + moving) / (rate or 1.0) * (1 + lam * loss_h)
        out.append(PoolWorth(itype, az, price, moving, rate, measured.get(itype), lam, loss_h, per_unit, note))
    return _explore_first(out) if measured else _by_cost(out)


def _by_cost(worths: list[PoolWorth]) -> list[PoolWorth]:
    return sorted(worths, key=lambda w: (w.per_unit is None, w.per_unit or 0.0, w.price is None, w.price or 0.0))


def _explore_first(worths: list[PoolWorth]) -> list[PoolWorth]:
    """A type to explore is ranked just ahead of the best measured pool, the cheapest by the hour first: its rate is
    set so that its $ per unit is just below the best one's, so that EC2's per-unit price picks it."""
    known = _by_cost([w for w in worths if w.rate is not None])
    best = next((w.per_unit for w in known if w.per_unit is not None), None)
    waiting = sorted((w for w in worths if w.rate is None), key=lambda w: (w.price is None, w.price or 0.0))
    explore, unpriced = [], []
    for k, w in enumerate(waiting):
        if w.price is None or not best:
            unpriced.append(w)
            continue
        per_unit = best * (0.98 + 0.001 * k)
        rate = (w.price + w.transfer_per_h) / per_unit * (1 + w.reclaims_per_h * w.loss_h)
        explore.append(dataclasses.replace(w, rate=rate, per_unit=per_unit))
    return explore + known + unpriced


def units_per_run(*measured: dict[str, dict]) -> tuple[float, int] | None:
    """(the median units of work a run did, how many runs): each run's measured attempts summed ("run#attempt" keys,
    "<sweep>/run#attempt" for earlier sweeps'); None before any. An estimate: a run still going counts what it did."""
    runs: dict[str, float] = {}
    for attempts in measured:
        for key, entry in attempts.items():
            work = entry.get("work") if isinstance(entry, dict) else None
            if isinstance(key, str) and _positive(work):
                run = key.rpartition("#")[0]
                runs[run] = runs.get(run, 0.0) + float(work)  # type: ignore[arg-type]
    return (median(runs.values()), len(runs)) if runs else None


def moved_per_h(moved: dict[str, object]) -> tuple[float, float]:
    """Bytes an hour a host moves up to the store and down from it, over the sweep's measured attempts (`rates.json`'s
    "moved": "run#attempt" -> [up, down, seconds]); entries that are not numbers are passed over (input)."""
    up = down = seconds = 0.0
    for entry in moved.values() if isinstance(moved, dict) else ():
        if isinstance(entry, list) and len(entry) == 3 and all(_number(x) is not None and x >= 0 for x in entry):
            up, down, seconds = up + entry[0], down + entry[1], seconds + entry[2]
    return (up / seconds * 3600, down / seconds * 3600) if seconds > 0 else (0.0, 0.0)


def loss_seconds(boots: list[float], checkpoint_s: float = CHECKPOINT_S) -> float:
    """Seconds of work a reclaim costs: half a checkpoint interval, plus the median measured boot and restore."""
    return checkpoint_s / 2 + (median(boots) if boots else BOOT_S)


def weights(worths: list[PoolWorth]) -> dict[tuple[str, str], float]:
    """CreateFleet's `WeightedCapacity` per pool: its effective rate over the smallest one (so the smallest is 1, the
    target capacity of a one-instance request, and EC2 prices per unit). {} for no pool."""
    eff = {(w.instance_type, w.az): w.effective for w in worths}
    least = min(eff.values(), default=0.0)
    return {pool: round(e / least, 4) for pool, e in eff.items()} if least > 0 else {}


def realized(entries: dict[str, dict], attempts: dict[str, dict]) -> dict:
    """What `orch collect` reports of the work bought: per type its measured rate, its dollars (the ledger's instances
    of it) and units (the attempts measured on it), their ratio; and what ranking by the hour alone would have spent
    on the same units — all of them at the rate and mean hourly price of the type cheapest by the hour — an estimate
    from the same measurements."""
    measured = rates(attempts)
    units: dict[str, float] = {}
    for a in attempts.values():
        if isinstance(a, dict) and a.get("type") in measured and _number(a.get("work")):
            units[a["type"]] = units.get(a["type"], 0.0) + float(a["work"])
    spent: dict[str, list[float]] = {}  # type -> [dollars, hours]
    for e in entries.values():
        if not isinstance(e, dict) or e.get("role") or not isinstance(e.get("type"), str):
            continue
        price, start, end = _number(e.get("price_per_h")), _number(e.get("start")), _number(e.get("end"))
        if price is None or start is None or end is None:
            continue
        hours = max(0.0, end - start) / 3600
        s = spent.setdefault(e["type"], [0.0, 0.0])
        s[0], s[1] = s[0] + price * hours, s[1] + hours
    rows = [
        {
            "type": t,
            "units_per_h": round(r.per_s * 3600, 4),
            "attempts": r.attempts,
            "usd": round(spent.get(t, [0.0])[0], 4),
            "units": round(units.get(t, 0.0), 4),
            "usd_per_unit": round(spent[t][0] / units[t], 6) if units.get(t) and t in spent else None,
        }
        for t, r in sorted(measured.items())
    ]
    priced = {t: s[0] / s[1] for t, s in spent.items() if s[1] > 0 and t in measured}
    total_units, total_usd = sum(units.values()), sum(s[0] for s in spent.values())
    by_hour = None
    if priced and total_units and all(t in priced for t in units):
        # like with like: the work's own hours at each type's measured rate and mean price, against all of it on the
        # type cheapest by the hour (boots, restores and idle time are in neither)
        def cost(t: str, n: float) -> float:
            return n / (measured[t].per_s * 3600) * priced[t]

        cheapest = min(priced, key=lambda t: priced[t])
        work_usd = sum(cost(t, n) for t, n in units.items())
        by_hour = {"type": cheapest, "usd": round(cost(cheapest, total_units), 6), "work_usd": round(work_usd, 6)}
    return {"types": rows, "units": round(total_units, 4), "usd": round(total_usd, 4), "by_the_hour": by_hour}
