"""Buying work (`aws.choose: work`, the default): the sweep's measured work rates, and what they make of each choice.

The controller hands the aws backend every record it reads (`Backend.learn`): an attempt whose agent reported its
first and newest (work, seconds) (RunTask.work_key) is one measurement of its instance type, kept per attempt in
`<sweep>/rates.json` (written when one changes; an attempt's newest measurement replaces its older one, so a record
read twice counts once), with the attempt's boot and restore (its command's start less its instance's). A relaunch
and `--remote`'s controller read the same file. Each acquisition then weighs its choices (cloud/worth.py): EC2 picks
the lowest expected $ per unit of work among the pools it has capacity in. `aws.choose: price` leaves the choices
unweighted (EC2 ranks by the hour). A rates.json that is not what orch writes is set aside and rebuilt, never
trusted and never a crash.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from statistics import median
from typing import Any

from orchestrator.backends.aws import earlier
from orchestrator.backends.aws.bought import newest
from orchestrator.backends.aws.cloud import scores, worth
from orchestrator.backends.aws.cloud.pools import Choice
from orchestrator.backends.aws.cloud.pricing import GB, CostLedger, attempts_on, region_of_az, transfer_rate
from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json
from orchestrator.store.lifecycle import RunStatus

log = logging.getLogger("orch.aws")


class WorkBook:
    """The sweep's work rates: learned from records, kept in the store, turned into CreateFleet weights."""

    def __init__(self, store: Store, sweep: str, ledger: CostLedger, choose: str, work_key: str, command: str = ""):
        self.store, self.key, self.ledger = store, layout.rates_key(sweep), ledger
        self.sweep, self.choose, self.work_key = sweep, choose, work_key
        self.command_key = earlier.command_key(command, work_key)
        self.lock = threading.Lock()
        self._doc: dict[str, Any] | None = None
        self._earlier: earlier.Earlier | None = None  # what earlier sweeps in the store measured (earlier.py)
        self._gathered = False  # read from the store's index in this process (a launch, a dry run)
        # AWS's Spot placement scores (cloud/scores.py): asked through `scorer` (set with the state), kept REFRESH_S
        self.scorer: Callable[[], scores.Scores] | None = None
        self._scores, self._scored_at = scores.Scores(), 0.0
        self.last: dict[tuple[str, str], str] = {}  # pool -> why it ranked where it did at the last weighing

    def doc(self) -> dict[str, Any]:
        """rates.json: {"work_key", "attempts": {"run#attempt": {type, work, seconds}}, "boots": {"run#attempt": s},
        "moved": {"run#attempt": [bytes up, bytes down, seconds]}}."""
        if self._doc is None:
            self._doc = self._read() or {"work_key": self.work_key, "attempts": {}, "boots": {}}
        return self._doc

    def _read(self) -> dict[str, Any] | None:
        """The record in the store when it is one of this work key's; None (measured again, said once) otherwise."""
        try:
            found = get_json(self.store, self.key)
        except Exception as exc:  # unreadable (not JSON, a folder): measured again from here
            log.warning("%s could not be read (%s); measuring work rates again", self.key, exc)
            return None
        if found is None:
            return None
        if not (isinstance(found, dict) and isinstance(found.get("attempts"), dict)) or found.get("work_key") not in (
            None,
            self.work_key,
        ):
            log.warning("%s is not a rates record of work key %r; measuring again", self.key, self.work_key)
            return None
        parts = {k: found[k] if isinstance(found.get(k), dict) else {} for k in ("boots", "moved")}
        return {**found, **parts}

    def gather(self) -> earlier.Earlier:
        """What earlier sweeps in the store measured, read now (a launch, a dry run); once per process."""
        with self.lock:
            if not self._gathered:  # (what before() may have read of an earlier launch is replaced)
                self._gathered = True
                try:
                    self._earlier = earlier.gather(self.store, self.sweep, self.command_key)
                except Exception as exc:  # the index unreadable: this sweep starts from its own measurements
                    log.warning("earlier sweeps' work rates could not be read (%s); starting from this sweep's", exc)
                    self._earlier = earlier.Earlier()
            return self._earlier or earlier.Earlier()

    def keep(self) -> None:
        """At a launch: what was gathered, for this sweep's controllers (a remote one reads only its prefix)."""
        earlier.keep(self.store, self.sweep, self.command_key, self.gather())

    def before(self) -> earlier.Earlier:
        """What the launch gathered (a controller that did not launch reads the sweep's earlier.json)."""
        with self.lock:
            if self._earlier is None:
                self._earlier = earlier.kept(self.store, self.sweep)
            return self._earlier

    def placement(self) -> scores.Scores:
        """The placement scores, asked again after REFRESH_S (never again once not worth asking: too few types,
        refused by IAM — said once, in the log)."""
        if self.choose != "work" or self.scorer is None or self._scores.final:
            return self._scores
        if time.time() - self._scored_at >= scores.REFRESH_S:
            self._scores, self._scored_at = self.scorer(), time.time()
            (log.warning if self._scores.refused else log.info)("spot placement scores: %s", self._scores.note)
        return self._scores

    def measured(self) -> dict[str, worth.Rate]:
        """Per type: the sweep's own measured attempts and those of earlier sweeps of the same command."""
        before = self.before()
        with self.lock:
            return worth.rates(self.doc()["attempts"], before.attempts)

    def units_per_run(self) -> tuple[float, int] | None:
        """The median units a run of this command did (this sweep's and earlier sweeps' runs), and over how many."""
        before = self.before()
        with self.lock:
            return worth.units_per_run(self.doc()["attempts"], before.attempts)

    def _boots(self) -> list[float]:
        before = self.before()
        with self.lock:
            boots = [*self.doc()["boots"].values(), *before.boots.values()]
        return [float(b) for b in boots if _seconds(b)]  # (rates.json is input)

    def learn(self, statuses: dict[str, RunStatus]) -> None:
        """Fold the records just read into the rates; written to the store only when one changed."""
        with self.ledger.lock:  # (run, attempt) -> its instance's entry, once a pass: not once per record
            entries = [e for e in self.ledger.entries.values() if isinstance(e, dict)]
        instance_of = {pair: e for e in entries for pair in attempts_on(e)}
        with self.lock:
            doc, changed = self.doc(), False
            for run_id, status in statuses.items():
                where = instance_of.get((run_id, status.attempt)) if status.attempt else None
                if where is None:
                    continue
                key = f"{run_id}#{status.attempt}"
                work = status.work
                if len(work) == 4 and work[2] > work[0] and work[3] > work[1]:
                    entry = {"type": where["type"], "work": work[2] - work[0], "seconds": work[3] - work[1]}
                    changed |= doc["attempts"].get(key) != entry
                    doc["attempts"][key] = entry
                changed |= _moved(doc, key, status.moved.get(str(status.attempt)), where)
                boot = (status.started_at or 0) - float(where.get("start") or 0)
                if status.started_at and key not in doc["boots"] and 0 < boot < 3600:
                    doc["boots"][key], changed = round(boot, 1), True
            if changed:
                put_json(self.store, self.key, doc)

    def switch_s(self) -> float | None:
        """The median measured boot + restore of the sweep's attempts (what moving a run costs), None before one."""
        boots = self._boots()
        return median(boots) if boots else None

    def scale(self, types: list[str]) -> dict[str, float]:
        """`deadline:` — how much longer a run's work left would take on the slowest of `types` with a measured rate
        than on the type of its newest attempt (run -> factor; "" -> the fastest's, for a run not started yet). {}
        while fewer than two of `types` are measured: a type without a rate is taken as fast as the others."""
        measured = self.measured()
        known = {t: measured[t].per_s for t in types if t in measured}
        if len(known) < 2:
            return {}
        slowest = min(known.values())
        on = {run: t for run, t in newest(self.ledger.runs_entries(), "type").items() if t in known}
        return {"": max(known.values()) / slowest} | {run: known[t] / slowest for run, t in on.items()}

    def ranked(self, pools: list[tuple[str, str]], price_of) -> list[worth.PoolWorth]:
        """Every pool's worth now, best first (cloud/worth.py)."""
        measured, boots, before = self.measured(), self._boots(), self.before()
        with self.ledger.lock:
            entries = dict(self.ledger.entries)
        tried: dict[str, int] = {}  # the sweep's own attempts per type (what exploring a type counts)
        for e in entries.values():
            if isinstance(e, dict) and isinstance(e.get("type"), str) and not e.get("role"):
                tried[e["type"]] = tried.get(e["type"], 0) + 1
        history = {**before.ledger, **entries}  # every pool's reclaims: this sweep's and earlier sweeps' (any command)
        loss_s, had = worth.loss_seconds(boots), self.placement().by_az
        with self.lock:
            up_h, down_h = worth.moved_per_h(self.doc().get("moved") or {})

        def transfer_of(az: str) -> float:
            """$/h of inter-region transfer a host in `az`'s region is expected to cost (none in the home region)."""
            if not (up_h or down_h):
                return 0.0
            region, home = region_of_az(az), self.ledger.home
            if not region or not home or region == home:
                return 0.0
            return (up_h * transfer_rate(region, home) + down_h * transfer_rate(home, region)) / GB

        return worth.rank(pools, price_of, measured, tried, history, time.time(), loss_s, had, transfer_of)

    def why(self, instance_type: str, az: str) -> str:
        """Why a pool was chosen, as the last weighing ranked it (for the controller's log)."""
        return self.last.get((instance_type, az), "by the hour (aws.choose: price)" if self.choose != "work" else "")

    def weigh(self, choices: list[Choice], price_of) -> list[Choice]:
        """The choices weighted by their pools' work (`choose: work`), best first; as they are with `choose: price`."""
        if self.choose != "work" or not choices:
            return choices
        ranked = self.ranked(sorted({(c.instance_type, c.az) for c in choices}), price_of)
        weights, order = worth.weights(ranked), {(w.instance_type, w.az): k for k, w in enumerate(ranked)}
        self.last = {
            (w.instance_type, w.az): f"ranked {k + 1} of {len(ranked)} by $ per {self.work_key}: {w.note}"
            for k, w in enumerate(ranked)
        }
        weighed = [replace(c, weight=weights.get((c.instance_type, c.az))) for c in choices]
        # the best pool first: a run of several nodes asks one pool at a time, in this order (cloud/fleet.py)
        return sorted(weighed, key=lambda c: order.get((c.instance_type, c.az), len(order)))


def _seconds(value: object) -> bool:
    """A boot as orch records one: a number of seconds above 0 and under an hour (not NaN, not Infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 3600


def _moved(doc: dict, key: str, moved: object, where: dict) -> bool:
    """Keep the attempt's bytes moved to and from the store with its instance's seconds so far (for the transfer a
    pool outside the store's region adds: worth.moved_per_h), when its bytes changed. Whether they did."""
    start = where.get("start")
    if not (isinstance(moved, list) and len(moved) == 2 and isinstance(start, (int, float))):
        return False
    old = doc.setdefault("moved", {}).get(key)
    if isinstance(old, list) and old[:2] == moved:
        return False
    end = where.get("end")
    doc["moved"][key] = [*moved, round(max(0.0, (end if isinstance(end, (int, float)) else time.time()) - start), 1)]
    return True
