"""Prices and realized cost: spot price history -> an estimate before launch and the spend after.

The spend of a sweep is kept as a ledger in the store (<sweep>/cost.json): one entry per instance
with its type, AZ, market, hourly price at acquisition, run, GPUs, and first/last time it was seen running,
so wasted attempts (interrupted, failed) count too, and `orch status` can show it without AWS calls.
Every entry carries the region its instance ran in (from its AZ) and the sweep's home region (the store's).

Prices are per region. Spot prices come from each region's own DescribeSpotPriceHistory (an AZ belongs to one
region). On-demand prices are not in the EC2 API: orch keeps the published Linux on-demand prices of the regions in
ON_DEMAND_BY_REGION for the types it knows; a region not in that table is priced at REGION_UPLIFT times us-east-1's
published price (an upper estimate, named in `--dry-run`); a type not in it at ON_DEMAND_FACTOR times the spot price
of the same (type, AZ) — approximations, said so wherever they are shown.

Data moved between a host outside the home region and the store is inter-region data transfer, billed by the region
the bytes leave (transfer_rate): the agent counts the bytes of each attempt (status.json's `moved`), and
transfer_usd prices them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from orchestrator.store import layout

log = logging.getLogger("orch.pricing")

ON_DEMAND_FACTOR = 3.0
# Published Linux on-demand prices, us-east-1, USD per hour (aws.amazon.com/ec2/pricing/on-demand), as of
# 2025-06: AWS cut P5 by up to 45% and P4d by up to 33% that month ("Announcing up to 45% price reduction for
# Amazon EC2 NVIDIA GPU-accelerated instances", AWS What's New, June 2025). Other regions differ by up to ~30%.
# They price the on-demand hours of the ledger (and `budget_usd` counts them), so a stale entry misstates spend.
ON_DEMAND_USD_PER_H = {
    "g4dn.xlarge": 0.526,
    "g4dn.12xlarge": 3.912,
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.12xlarge": 5.672,
    "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048,
    "g6.12xlarge": 4.6016,
    "g6e.xlarge": 1.861,
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
    "p4d.24xlarge": 21.96,
    "p5.48xlarge": 55.04,
    # the small burstable types a remote controller runs on (`aws.controller.instance_type`)
    "t3.nano": 0.0052,
    "t3.micro": 0.0104,
    "t3.small": 0.0208,
    "t3.medium": 0.0416,
    "t4g.nano": 0.0042,
    "t4g.micro": 0.0084,
    "t4g.small": 0.0168,
}


# us-east-2 (Ohio) and us-west-2 (Oregon) publish the same Linux on-demand price as us-east-1 for every type above
# (aws.amazon.com/ec2/pricing/on-demand, the page's region selector; not read from the live page from this sandbox:
# check there). A region added here needs its own figures from that page.
ON_DEMAND_BY_REGION: dict[str, dict[str, float]] = {
    "us-east-1": ON_DEMAND_USD_PER_H,
    "us-east-2": ON_DEMAND_USD_PER_H,
    "us-west-2": ON_DEMAND_USD_PER_H,
}
# A region not in ON_DEMAND_BY_REGION: us-east-1's published price x REGION_UPLIFT. An assumption, not a published
# figure: the same type costs more per hour in most other regions (Europe, Asia Pacific, South America) than in
# us-east-1; erring high makes `budget_usd` stop a sweep early rather than late, and `--dry-run` names every region
# priced so. Spot hours are never priced so: each region's spot history is its own.
REGION_UPLIFT = 1.5
HOME_REGION = "us-east-1"  # the region whose table prices a region missing from ON_DEMAND_BY_REGION


def region_of_az(az: str) -> str:
    """The region an AZ (or a Local/Wavelength Zone) belongs to: `us-west-2b` -> `us-west-2`,
    `us-west-2-lax-1a` -> `us-west-2`, `us-gov-west-1a` -> `us-gov-west-1`; "" for a name of no region."""
    m = re.match(r"[a-z]{2}(?:-[a-z]+)+-\d+", az or "")
    return m.group(0) if m else ""


def on_demand_quote(
    instance_type: str, spot_price: float | None, region: str = HOME_REGION
) -> tuple[float | None, str]:
    """An on-demand hour of the type in `region`, and how orch got it: `published` (the region's table),
    `uplift` (us-east-1's x REGION_UPLIFT), `spot` (ON_DEMAND_FACTOR x the spot price) or `unknown`."""
    table = ON_DEMAND_BY_REGION.get(region)
    if table is not None and instance_type in table:
        return table[instance_type], "published"
    if table is None and instance_type in ON_DEMAND_BY_REGION[HOME_REGION]:
        return round(ON_DEMAND_BY_REGION[HOME_REGION][instance_type] * REGION_UPLIFT, 6), "uplift"
    if spot_price is not None:
        return spot_price * ON_DEMAND_FACTOR, "spot"
    return None, "unknown"


def on_demand_price(instance_type: str, spot_price: float | None, region: str = HOME_REGION) -> float | None:
    """An on-demand hour of the type in `region` (on_demand_quote says how it was got)."""
    return on_demand_quote(instance_type, spot_price, region)[0]


# --- inter-region data transfer ---------------------------------------------------------------------
# AWS bills bytes that leave a region for another one ("Data Transfer OUT From Amazon EC2 To ... another AWS
# Region", aws.amazon.com/ec2/pricing/on-demand, section "Data Transfer"; S3's page, aws.amazon.com/s3/pricing,
# "Data Transfer", has the same rates for bytes leaving a bucket). The rate is the source region's: $0.02/GB out of
# the US and EU regions below, $0.01/GB between us-east-1 and us-east-2 (the page lists that pair apart). Not read
# from the live pages from this sandbox: check them there. Transfer within a region (EC2 <-> S3) is free.
TRANSFER_USD_PER_GB = {
    "us-east-1": 0.02,
    "us-east-2": 0.02,
    "us-west-1": 0.02,
    "us-west-2": 0.02,
    "ca-central-1": 0.02,
    "eu-west-1": 0.02,
    "eu-west-2": 0.02,
    "eu-central-1": 0.02,
}
TRANSFER_PAIR_USD_PER_GB = {("us-east-1", "us-east-2"): 0.01, ("us-east-2", "us-east-1"): 0.01}
# A source region not in the table: an assumption that errs high for most (Asia Pacific regions publish rates
# around this; São Paulo more), said by `--dry-run`.
TRANSFER_FALLBACK_USD_PER_GB = 0.09
GB = 1024**3  # AWS's pricing GB (2^30 bytes)


def transfer_rate(source: str, dest: str) -> float:
    """Dollars per GB that leave region `source` for region `dest` (0 within one region)."""
    if not source or not dest or source == dest:
        return 0.0
    if (source, dest) in TRANSFER_PAIR_USD_PER_GB:
        return TRANSFER_PAIR_USD_PER_GB[(source, dest)]
    return TRANSFER_USD_PER_GB.get(source, TRANSFER_FALLBACK_USD_PER_GB)


def entry_region(entry: dict) -> str:
    """The region a ledger entry's instance ran in (an older ledger names only its AZ)."""
    return entry.get("region") or region_of_az(entry.get("az", ""))


def attempt_regions(ledger: dict[str, dict]) -> dict[str, dict[int, str]]:
    """run -> {attempt: region}: where each attempt of each run ran (packed instances: every run on them)."""
    out: dict[str, dict[int, str]] = {}
    for e in ledger.values():
        for run, attempt in attempts_on(e):
            out.setdefault(run, {})[attempt] = entry_region(e)
    return out


def attempt_whys(ledger: dict[str, dict]) -> dict[str, dict[int, str]]:
    """run -> {attempt: where it went and why} (`orch status`): its pool and how that pool ranked when bought."""
    out: dict[str, dict[int, str]] = {}
    for e in ledger.values():
        if isinstance(e, dict) and isinstance(e.get("why"), str):
            for run, attempt in attempts_on(e):
                out.setdefault(run, {})[attempt] = f"{e.get('type')} in {e.get('az')}, {e['why']}"
    return out


def attempts_on(entry: dict) -> list[tuple[str, int]]:
    """(run, attempt) of every attempt a ledger entry's instance held: its one run's, or on a shared instance each
    run's attempts seen in its slots (`attempts`; 0 for a run of a ledger written before they were recorded)."""
    if entry.get("run"):
        return [(entry["run"], int(entry.get("attempt") or 0))]
    seen = entry.get("attempts") or {}
    return [(run, int(a)) for run in entry.get("run_s") or {} for a in seen.get(run) or [0]]


def transfer_usd(ledger: dict[str, dict], run_id: str, moved: dict[str, list[int]]) -> tuple[float, int]:
    """(dollars, bytes) of the run's inter-region transfer: per attempt, the bytes its agent counted (`moved`:
    attempt -> [bytes up to the store, bytes down from it]) when the attempt ran outside the home region; up at
    the host region's rate, down at the home region's."""
    where = {}
    for e in ledger.values():
        for run, attempt in attempts_on(e):
            if run == run_id:
                where[str(attempt)] = (entry_region(e), e.get("home") or entry_region(e))
    usd, crossed = 0.0, 0
    for attempt, (up, down) in moved.items():
        region, home = where.get(attempt, ("", ""))
        if region and home and region != home:
            usd += up / GB * transfer_rate(region, home) + down / GB * transfer_rate(home, region)
            crossed += up + down
    return usd, crossed


CACHE_S = 3600.0


def per_run(ledger: dict[str, dict], now: float | None = None) -> dict[str, tuple[float, float]]:
    """(dollars, GPU-hours) per run: every instance of every attempt of the run counts; a shared
    (packed) instance counts for each run by the time it held a slot (its share: 1/slots of the
    instance), so slots nobody used are in the sweep's spend but in no run's."""
    out: dict[str, tuple[float, float]] = {}

    def add(run: str, hours: float, price: float, gpus: float) -> None:
        usd, gpu_h = out.get(run, (0.0, 0.0))
        out[run] = (usd + hours * price, gpu_h + hours * gpus)

    for entry in ledger.values():
        price, gpus, slots = (
            float(entry.get("price_per_h") or 0.0),
            int(entry.get("gpus") or 0),
            int(entry.get("slots") or 0),
        )
        if slots:
            for run, seconds in (entry.get("run_s") or {}).items():
                add(run, seconds / 3600, price / slots, gpus / slots)
        elif entry.get("run"):
            end = entry.get("end") or now or time.time()
            add(entry["run"], max(0.0, end - entry["start"]) / 3600, price, gpus)
    return out


CONTROLLER_ROLE = "controller"  # a ledger entry's `role` for the instance a remote controller runs on


def controller_cost(ledger: dict[str, dict], now: float | None = None) -> float:
    """Dollars of the sweep's remote controller instances (part of ledger_cost; no run's)."""
    return ledger_cost({k: e for k, e in ledger.items() if e.get("role") == CONTROLLER_ROLE}, now)


def ledger_cost(ledger: dict[str, dict], now: float | None = None) -> float:
    """Dollars spent by the instances in a ledger (open entries count up to `now`)."""
    total = 0.0
    for entry in ledger.values():
        end = entry.get("end") or now or time.time()
        hours = max(0.0, end - entry["start"]) / 3600
        total += hours * float(entry.get("price_per_h") or 0.0)
    return total


class PriceBook:
    """Hourly prices per (type, AZ), from the spot price history, refreshed hourly."""

    def __init__(self, fetch):
        self.fetch = fetch  # (types, azs) -> {(type, az): spot price}
        self.prices: dict[tuple[str, str], float] = {}
        self.fetched_at = 0.0

    def price(self, instance_type: str, az: str, market: str) -> float | None:
        """The hour of (type, AZ) in `market`: the spot price of the AZ, or the on-demand price of its region."""
        if (instance_type, az) not in self.prices or time.time() - self.fetched_at > CACHE_S:
            self.prices.update(self.fetch([instance_type], [az]))
            self.fetched_at = time.time()
        spot = self.prices.get((instance_type, az))
        # an on-demand hour has its published price even where the pool has no spot history
        return spot if market == "spot" else on_demand_price(instance_type, spot, region_of_az(az) or HOME_REGION)


class CostLedger:
    """The sweep's realized cost in the store (<sweep>/cost.json), kept by the controller.

    Read on first use (after preflight checked the store); written when an instance comes or goes,
    and every 30 s while any runs. Running instances bill until the last time they were seen.
    """

    def __init__(self, store, sweep: str, prices: PriceBook, home: str | Callable[[], str] = ""):
        self.store, self.key, self.prices = store, layout.cost_key(sweep), prices
        # the store's region: an instance elsewhere pays for what it moves to and from it. A function finds it on
        # first use: a controller that ran no preflight (a background or remote one) must not take the first region
        self._home = home
        self.lock = threading.Lock()
        self._entries: dict[str, dict] | None = None
        self._live: set = set()  # instances seen running in the last pass
        self._saved_at = 0.0

    @property
    def home(self) -> str:
        if callable(self._home):
            try:
                self._home = self._home()
            except Exception as exc:  # an unknown home must not lose the instance; the next one asks again
                log.warning("the store's region is unknown: %s", exc)
                return ""
        return self._home

    @home.setter
    def home(self, region: str) -> None:
        self._home = region

    @property
    def entries(self) -> dict[str, dict]:
        entries = self._entries
        if entries is None:
            from orchestrator.store.base import get_json

            entries = self._entries = get_json(self.store, self.key) or {}
        return entries

    def acquired(
        self,
        instance_id: str,
        instance_type: str,
        az: str,
        market: str,
        run: str = "",
        gpus: int = 0,
        slots: int = 0,
        attempt: int = 0,
        role: str = "",
        why: str = "",
    ) -> None:
        try:
            price = self.prices.price(instance_type, az, market)
        except Exception as exc:  # a missing price must not lose the instance
            log.warning("no price for %s in %s: %s", instance_type, az, exc)
            price = None
        now, home = time.time(), self.home
        with self.lock:
            self.entries[instance_id] = {
                "type": instance_type,
                "az": az,
                "region": region_of_az(az),
                **({"home": home} if home else {}),
                "market": market,
                "price_per_h": price,
                "start": now,
                "end": now,
                "run": run,
                "gpus": gpus,
                **({"slots": slots, "run_s": {}, "attempts": {}} if slots else {}),
                **({"attempt": attempt} if attempt else {}),
                **({"role": role} if role else {}),
                **({"why": why} if why else {}),  # aws.choose: how its pool ranked when it was bought
            }
            self._save()

    def observe(self, live_ids: list[str], occupants: dict[str, list[tuple[str, int]]] | None = None) -> None:
        """Instances seen running now; `occupants`: the (run, attempt) in each slot of each shared instance (their
        slot time grows; each attempt is recorded, so that each attempt's region is known)."""
        now, new_attempt = time.time(), False
        with self.lock:
            for iid in live_ids:
                entry = self.entries.get(iid)
                if entry is not None:
                    for run, attempt in (occupants or {}).get(iid, []) if "run_s" in entry else []:
                        entry["run_s"][run] = entry["run_s"].get(run, 0.0) + max(0.0, now - entry["end"])
                        held = entry.setdefault("attempts", {}).setdefault(run, [])
                        if attempt not in held:
                            held.append(attempt)
                            new_attempt = True
                    entry["end"] = now
            live = set(live_ids)
            if live != self._live or new_attempt or (live and now - self._saved_at > 30):
                self._save()  # an instance came or went, a run's attempt came to a shared one, or 30 s passed
            self._live = live

    def reclaimed(self, instance_id: str) -> None:
        """The instance was taken back (or lost): its pool's reclaims count it (cloud/worth.py)."""
        with self.lock:
            entry = self.entries.get(instance_id)
            if entry is not None and "reclaimed" not in entry:
                entry["reclaimed"] = time.time()
                self._save()

    def last_seen(self) -> float:
        """When any instance of the sweep was last seen running (or acquired); 0.0 for none."""
        with self.lock:
            return max((float(e.get("end") or 0.0) for e in self.entries.values()), default=0.0)

    def spend(self) -> float:
        with self.lock:
            return ledger_cost(self.entries, now=time.time())

    def runs_entries(self) -> list[dict]:
        """The entries of runs' instances (a controller's has a role), copied out under the lock."""
        with self.lock:
            return [dict(e) for e in self.entries.values() if isinstance(e, dict) and not e.get("role")]

    def places(self) -> dict[str, dict[int, str]]:
        """run -> {attempt: region} of what this ledger holds (attempt_regions)."""
        with self.lock:
            return attempt_regions(self.entries)

    def flush(self) -> None:
        """Save what passes added since the last write (a finished launch prints what `orch collect` reads)."""
        with self.lock:
            if self._entries is not None:
                self._save()

    def _save(self) -> None:
        from orchestrator.store.base import put_json

        put_json(self.store, self.key, self.entries)
        self._saved_at = time.time()
