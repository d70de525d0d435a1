"""Prices and realized cost: spot price history -> an estimate before launch and the spend after.

The spend of a sweep is kept as a ledger in the store (<sweep>/cost.json): one entry per instance
with its type, AZ, market, hourly price at acquisition, and first/last time it was seen running,
so wasted attempts (interrupted, failed) count too, and `orch status` can show it without AWS calls.
On-demand prices are not in the EC2 API; orch prices an on-demand hour at ON_DEMAND_FACTOR times
the spot price of the same (type, AZ) — an approximation, said so wherever it is shown.
"""

from __future__ import annotations

import time
from typing import Dict, Optional, Tuple

ON_DEMAND_FACTOR = 3.0
CACHE_S = 3600.0


def ledger_cost(ledger: Dict[str, dict], now: Optional[float] = None) -> float:
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
        self.prices: Dict[Tuple[str, str], float] = {}
        self.fetched_at = 0.0

    def price(self, instance_type: str, az: str, market: str) -> Optional[float]:
        if (instance_type, az) not in self.prices or time.time() - self.fetched_at > CACHE_S:
            self.prices.update(self.fetch([instance_type], [az]))
            self.fetched_at = time.time()
        spot = self.prices.get((instance_type, az))
        if spot is None:
            return None
        return spot if market == "spot" else spot * ON_DEMAND_FACTOR
