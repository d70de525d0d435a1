"""What earlier sweeps in the same store measured: work rates of the same command, reclaims of every pool
(`aws.choose: work`; docs/guides/costs.md, "Earlier sweeps").

The launch (on the laptop: `orch launch`, and `--remote`'s before its controller starts) lists the store's index,
`.orch-work/<command key>/<at>.<sweep>`, one entry per aws sweep, and keeps what it found in `<sweep>/earlier.json`:

- **the same command**: sweeps whose command key is this one's — a digest of the `command:` text and the work key
  (a space changed in `command:` is another command). Their measured attempts (their rates.json) count beside the
  sweep's own, so a later sweep of the same command starts measured instead of exploring every type again.
- **reclaims**: a pool's reclaims are the pool's, whatever ran on it: the cost ledgers of every indexed sweep, of any
  command, count in each pool's reclaims per hour and in the 5-minute cluster after one (cloud/worth.py).

At most NEWEST sweeps of each kind are read, newest first. A sweep enters the index at its launch while it has no
measurement of its own (rates.json absent), so a sweep forgotten with `orch aws rates SWEEP_FILE --forget` (which
deletes the command's entries) is not shared again by its own relaunch. A controller that did not launch (`--detach`'s,
a remote one: its role reads only its sweep's prefix) reads earlier.json. Everything read is input: what is not a
record orch writes is passed over, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json

log = logging.getLogger("orch.aws")

NEWEST = 20  # earlier sweeps read per kind (same command; any command for reclaims)
LEDGER_FIELDS = ("type", "az", "start", "end", "reclaimed", "role")  # what cloud/worth.py's history reads


def command_key(command: str, work_key: str) -> str:
    """ "The same command": the `command:` text and the work key, as written."""
    return hashlib.sha256(json.dumps([command, work_key]).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Earlier:
    """What earlier sweeps measured, as the launch found it."""

    sweeps: tuple[str, ...] = ()  # earlier sweeps of the same command whose attempts count
    attempts: dict[str, Any] = field(default_factory=dict)  # "<sweep>/<run>#<attempt>" -> {type, work, seconds}
    boots: dict[str, Any] = field(default_factory=dict)  # "<sweep>/<run>#<attempt>" -> seconds
    ledger: dict[str, Any] = field(default_factory=dict)  # "<sweep>/<instance>" -> {type, az, start, end, reclaimed}

    def doc(self) -> dict:
        return {"sweeps": list(self.sweeps), "attempts": self.attempts, "boots": self.boots, "ledger": self.ledger}

    @classmethod
    def of(cls, doc: Any) -> Earlier:
        """earlier.json as a record (input: a part that is not what orch writes is left out)."""
        if not isinstance(doc, dict):
            return cls()
        sweeps = doc.get("sweeps")
        names = tuple(s for s in sweeps if isinstance(s, str)) if isinstance(sweeps, list) else ()
        return cls(names, _dict(doc.get("attempts")), _dict(doc.get("boots")), _dict(doc.get("ledger")))


def _dict(found: Any) -> dict[str, Any]:
    return found if isinstance(found, dict) else {}


def gather(store: Store, sweep: str, key: str) -> Earlier:
    """The store's earlier sweeps, read now: the same command's attempts and boots, every sweep's reclaim history."""
    entries = [e for e in layout.work_index_entries(store.list(layout.work_index_prefix())) if e[2] != sweep]
    same = list(dict.fromkeys(s for k, _, s in entries if k == key))[:NEWEST]
    every = list(dict.fromkeys(s for _, _, s in entries))[:NEWEST]
    attempts: dict[str, Any] = {}
    boots: dict[str, Any] = {}
    for name in same:
        rates = _read(store, layout.rates_key(name))
        for part, into in (("attempts", attempts), ("boots", boots)):
            found = rates.get(part)
            into.update({f"{name}/{k}": v for k, v in found.items()} if isinstance(found, dict) else {})
    ledger: dict[str, Any] = {}
    for name in every:
        for iid, entry in _read(store, layout.cost_key(name)).items():
            if isinstance(entry, dict):
                ledger[f"{name}/{iid}"] = {f: entry[f] for f in LEDGER_FIELDS if f in entry}
    return Earlier(tuple(same), attempts, boots, ledger)


def _read(store: Store, key: str) -> dict:
    try:
        found = get_json(store, key)
    except Exception as exc:  # another sweep's record, unreadable: that sweep is passed over
        log.warning("%s could not be read (%s); passed over", key, exc)
        return {}
    return found if isinstance(found, dict) else {}


def keep(store: Store, sweep: str, key: str, found: Earlier) -> None:
    """At a launch: what was found, for the sweep's controllers; the sweep into the index while it measured nothing."""
    put_json(store, layout.earlier_key(sweep), found.doc())
    if store.exists(layout.rates_key(sweep)):
        return  # measured already: in the index since its first launch, or forgotten on purpose
    mine = [e for e in layout.work_index_entries(store.list(layout.work_index_prefix(key))) if e[2] == sweep]
    if not mine:
        store.put_bytes(layout.work_index_key(key, int(time.time()), sweep), b"{}")


def kept(store: Store, sweep: str) -> Earlier:
    """earlier.json, as the sweep's launch wrote it (nothing: no earlier sweep)."""
    return Earlier.of(_read(store, layout.earlier_key(sweep)))


def forget(store: Store, key: str) -> list[str]:
    """`orch aws rates --forget`: the command's sweeps leave the index (their own records stay). Their names."""
    names = [s for _, _, s in layout.work_index_entries(store.list(layout.work_index_prefix(key)))]
    store.delete_prefix(layout.work_index_prefix(key).rstrip("/"))
    return names
