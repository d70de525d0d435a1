"""Prices and realized cost: spot price history -> an estimate before launch and the spend after.

The spend of a sweep is kept as a ledger in the store (<sweep>/cost.json): one entry per instance
with its type, AZ, market, hourly price at acquisition, run, GPUs, and first/last time it was seen running,
so wasted attempts (interrupted, failed) count too, and `orch status` can show it without AWS calls.
On-demand prices are not in the EC2 API: orch uses the published Linux on-demand prices of us-east-1
for the GPU types it knows (ON_DEMAND_USD_PER_H) and, for any other type, ON_DEMAND_FACTOR times the
spot price of the same (type, AZ) — approximations, said so wherever they are shown.
"""

from __future__ import annotations

import logging
import threading
import time

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


def on_demand_price(instance_type: str, spot_price: float | None) -> float | None:
    """An on-demand hour of the type: the published price when known, else ON_DEMAND_FACTOR x its spot price."""
    if instance_type in ON_DEMAND_USD_PER_H:
        return ON_DEMAND_USD_PER_H[instance_type]
    return None if spot_price is None else spot_price * ON_DEMAND_FACTOR


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
        if (instance_type, az) not in self.prices or time.time() - self.fetched_at > CACHE_S:
            self.prices.update(self.fetch([instance_type], [az]))
            self.fetched_at = time.time()
        spot = self.prices.get((instance_type, az))
        # an on-demand hour has its published price even where the pool has no spot history
        return spot if market == "spot" else on_demand_price(instance_type, spot)


class CostLedger:
    """The sweep's realized cost in the store (<sweep>/cost.json), kept by the controller.

    Read on first use (after preflight checked the store); written when an instance comes or goes,
    and every 30 s while any runs. Running instances bill until the last time they were seen.
    """

    def __init__(self, store, sweep: str, prices: PriceBook):
        self.store, self.key, self.prices = store, layout.cost_key(sweep), prices
        self.lock = threading.Lock()
        self._entries: dict[str, dict] | None = None
        self._live: set = set()  # instances seen running in the last pass
        self._saved_at = 0.0

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
    ) -> None:
        try:
            price = self.prices.price(instance_type, az, market)
        except Exception as exc:  # a missing price must not lose the instance
            log.warning("no price for %s in %s: %s", instance_type, az, exc)
            price = None
        now = time.time()
        with self.lock:
            self.entries[instance_id] = {
                "type": instance_type,
                "az": az,
                "market": market,
                "price_per_h": price,
                "start": now,
                "end": now,
                "run": run,
                "gpus": gpus,
                **({"slots": slots, "run_s": {}} if slots else {}),
                **({"attempt": attempt} if attempt else {}),
                **({"role": role} if role else {}),
            }
            self._save()

    def observe(self, live_ids: list[str], occupants: dict[str, list[str]] | None = None) -> None:
        """Instances seen running now; `occupants`: the runs on each shared instance (their slot time grows)."""
        now = time.time()
        with self.lock:
            for iid in live_ids:
                entry = self.entries.get(iid)
                if entry is not None:
                    for run in (occupants or {}).get(iid, []) if "run_s" in entry else []:
                        entry["run_s"][run] = entry["run_s"].get(run, 0.0) + max(0.0, now - entry["end"])
                    entry["end"] = now
            live = set(live_ids)
            if live != self._live or (live and now - self._saved_at > 30):
                self._save()  # an instance came or went, or 30 s passed
            self._live = live

    def last_seen(self) -> float:
        """When any instance of the sweep was last seen running (or acquired); 0.0 for none."""
        with self.lock:
            return max((float(e.get("end") or 0.0) for e in self.entries.values()), default=0.0)

    def spend(self) -> float:
        with self.lock:
            return ledger_cost(self.entries, now=time.time())

    def flush(self) -> None:
        """Save what the passes since the last write added (they save only on a change or every 30 s), so that
        the spend a finished launch prints is the one `orch collect` reads."""
        with self.lock:
            if self._entries is not None:
                self._save()

    def _save(self) -> None:
        from orchestrator.store.base import put_json

        put_json(self.store, self.key, self.entries)
        self._saved_at = time.time()
