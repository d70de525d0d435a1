"""The cost ledger of backends whose machines are not bought by orch (ssh hosts, a Slurm cluster): one entry per
attempt where it ran (when it started and ended there, its GPUs, the hour's price if the user gave one), kept in the
store's cost.json. A run's GPU-hours are its GPUs times the hours it held them; its dollars, the entry's price per
hour times those hours. Each backend's ledger (ssh/ledger.py, slurm/ledger.py) says when entries start and end.
"""

from __future__ import annotations

import time

from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json


class HeldLedger:
    """cost.json, read once and written back when it changed (`flush`, each pass of the controller)."""

    def __init__(self, store: Store | None, sweep: str):
        self.store, self.sweep = store, sweep
        self.entries: dict[str, dict] = {}
        self.loaded = False
        self.dirty = False

    def _load(self) -> None:
        if not self.loaded and self.store is not None:
            found = get_json(self.store, layout.cost_key(self.sweep))
            self.entries = found if isinstance(found, dict) else {}
            self.loaded = True

    def flush(self) -> None:
        if self.dirty and self.store is not None:
            put_json(self.store, layout.cost_key(self.sweep), self.entries)
            self.dirty = False

    def spend(self) -> float:
        self._load()
        return total(self.entries)


def _hours(entry: dict, now: float) -> float:
    end = entry.get("end") or now
    return max(0.0, end - float(entry.get("start") or end)) / 3600


def total(ledger: dict[str, dict], now: float | None = None) -> float:
    now = now or time.time()
    return sum(_hours(e, now) * float(e.get("price_per_h") or 0.0) for e in ledger.values() if isinstance(e, dict))


def per_run(ledger: dict[str, dict], now: float | None = None) -> dict[str, tuple[float, float]]:
    now = now or time.time()
    out: dict[str, tuple[float, float]] = {}
    for e in ledger.values():
        if not isinstance(e, dict) or not e.get("run"):
            continue
        usd, gpu_h = out.get(e["run"], (0.0, 0.0))
        h = _hours(e, now)
        out[e["run"]] = (usd + h * float(e.get("price_per_h") or 0.0), gpu_h + h * int(e.get("gpus") or 0))
    return out


def places(ledger: dict[str, dict]) -> dict[str, dict[int, str]]:
    """run -> {attempt: where it ran (an entry's `host`)}."""
    out: dict[str, dict[int, str]] = {}
    for e in ledger.values():
        if isinstance(e, dict) and e.get("run") and isinstance(e.get("attempt"), int):
            out.setdefault(e["run"], {})[e["attempt"]] = str(e.get("host", ""))
    return out
