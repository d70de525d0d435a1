"""What a sweep's runs held on ssh hosts, for `orch collect` and `orch status`: one entry per attempt on a host (when
it started and ended there, its GPUs, the host-hour's price if the user gave one), kept in the store's cost.json.

A run's GPU-hours are its slot's GPUs times the hours it held them; its dollars (with `ssh.price_per_hour`) are the
host-hour's price times those hours, shared by the runs a host holds at once: a host with 4 slots costs each run a
quarter of its hour. Slots nobody used are not counted (they are not the sweep's to pay for: the machine is yours).
"""

from __future__ import annotations

import time

from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json


class Ledger:
    def __init__(self, store: Store | None, sweep: str, price: float | None, gpus: int):
        self.store, self.sweep, self.price, self.gpus = store, sweep, price, gpus
        self.entries: dict[str, dict] = {}
        self.loaded = False
        self.dirty = False

    def _load(self) -> None:
        if not self.loaded and self.store is not None:
            found = get_json(self.store, layout.cost_key(self.sweep))
            self.entries = found if isinstance(found, dict) else {}
            self.loaded = True

    def started(self, host: str, run: str, attempt: int, slots: int) -> None:
        self._load()
        price = (self.price or 0.0) / max(1, slots)
        key = f"{host}|{run}|{attempt}"
        self.entries[key] = {
            "host": host,
            "run": run,
            "attempt": attempt,
            "gpus": self.gpus,
            "price_per_h": price,
            "start": time.time(),
            "end": None,
        }
        self.dirty = True

    def ended(self, host: str, live: set[str]) -> None:
        """The host answered a listing: its open entries of runs not among `live` ended now."""
        self._load()
        now = time.time()
        for entry in self.entries.values():
            if entry.get("host") == host and entry.get("end") is None and entry.get("run") not in live:
                entry["end"] = now
                self.dirty = True

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
    """run -> {attempt: the host it ran on}."""
    out: dict[str, dict[int, str]] = {}
    for e in ledger.values():
        if isinstance(e, dict) and e.get("run") and isinstance(e.get("attempt"), int):
            out.setdefault(e["run"], {})[e["attempt"]] = str(e.get("host", ""))
    return out
