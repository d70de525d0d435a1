"""What a sweep's runs held on ssh hosts, for `orch collect` and `orch status`: one entry per attempt on a host (when
it started and ended there, its GPUs, the host-hour's price if the user gave one), kept in the store's cost.json.

A run's GPU-hours are its slot's GPUs times the hours it held them; its dollars (with `ssh.price_per_hour`) are the
host-hour's price times those hours, shared by the runs a host holds at once: a host with 4 slots costs each run a
quarter of its hour. Slots nobody used are not counted (they are not the sweep's to pay for: the machine is yours).
"""

from __future__ import annotations

import time

from orchestrator.backends.held import HeldLedger, per_run, places, total
from orchestrator.store.base import Store


class Ledger(HeldLedger):
    def __init__(self, store: Store | None, sweep: str, price: float | None, gpus: int):
        super().__init__(store, sweep)
        self.price, self.gpus = price, gpus

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


__all__ = ["Ledger", "per_run", "places", "total"]
