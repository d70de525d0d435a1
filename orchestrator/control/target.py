"""Time and dollars to a target (`target:` in sweep.yaml): DAWNBench's two numbers, per run and per sweep.

Per run, from its metrics lines (one file across attempts: a resumed run appends), its record and the
sweep's cost ledger (AWS):

- time_to_target_s: the `elapsed_s` of the first line that meets the target — the run's training
  seconds summed over its attempts, as the bundled trainer writes them (it restores them on resume);
- wall_to_target_s: that line's `time` (unix seconds of the write) minus the run's first claim, boots
  and lost attempts included;
- usd_to_target: what the run's instances cost from their start up to that moment, wasted attempts
  included (AWS only).

A command that writes neither `elapsed_s` nor `time` gets `reached` without the times.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.backends.registry import Costs
from orchestrator.contract import finite
from orchestrator.control.views import usd
from orchestrator.sweep.spec import TargetSection


@dataclass
class ToTarget:
    reached: bool = False
    time_to_target_s: float | None = None
    wall_to_target_s: float | None = None
    usd_to_target: float | None = None


def entries_of(ledger: dict[str, dict], run_id: str) -> list[dict]:
    return [e for e in ledger.values() if e.get("run") == run_id or run_id in (e.get("run_s") or {})]


def usd_until(entries: list[dict], run_id: str, until: float | None = None) -> float:
    """Dollars of a run's instances up to `until` (None: all). A shared instance counts the run's slot
    time at its share, spread evenly over the instance's life."""
    total = 0.0
    for e in entries:
        start, end, price = float(e.get("start") or 0), float(e.get("end") or 0), float(e.get("price_per_h") or 0)
        stop = end if until is None else min(end, until)
        if stop <= start:
            continue
        if e.get("slots"):
            seconds = float((e.get("run_s") or {}).get(run_id, 0.0)) * (stop - start) / max(end - start, 1e-9)
            total += seconds / 3600 * price / int(e["slots"])
        else:
            total += (stop - start) / 3600 * price
    return total


MAX_SECONDS = 366 * 86400.0  # a time to target beyond a year is no run's: a command's garbage, not a record
CLOCK_SKEW_S = 60.0  # a line's `time` may be a little before the claim (the host's clock against the controller's)


def seconds(v) -> float | None:
    """A duration from a metrics line: finite, not negative, at most a year; else None (it counts as none)."""
    s = finite(v)
    return s if s is not None and 0.0 <= s <= MAX_SECONDS else None


def to_target(
    target: TargetSection,
    lines: list[dict],
    first_started_at: float | None,
    entries: list[dict] | None,
    run_id: str,
) -> ToTarget:
    """From the first line that meets the target (a later line may fall back, or flatter)."""
    for line in lines:
        if target.met(line):
            at = finite(line.get("time"))
            wall = None if at is None or first_started_at is None else at - first_started_at
            if wall is not None and not -CLOCK_SKEW_S <= wall <= MAX_SECONDS:
                wall = at = None  # the line's clock is not the claim's: no wall time, no dollars to it
            return ToTarget(
                reached=True,
                time_to_target_s=seconds(line.get("elapsed_s", line.get("elapsed"))),
                wall_to_target_s=None if wall is None else max(0.0, wall),
                usd_to_target=None if entries is None or at is None else usd_until(entries, run_id, at),
            )
    return ToTarget()


def reached_in_files(store, sweep: str, target: TargetSection, run_ids: list[str]) -> set:
    """The runs a line of whose metrics file meets the target (read in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.store import layout
    from orchestrator.store.base import read_jsonl

    def met(rid: str) -> bool:
        return any(target.met(line) for line in read_jsonl(store.get_bytes(layout.metrics_key(sweep, rid))))

    if not run_ids:
        return set()
    with ThreadPoolExecutor(max_workers=min(10, len(run_ids))) as pool:
        return {rid for rid, yes in zip(run_ids, pool.map(met, run_ids)) if yes}


@dataclass
class Economics:
    """The sweep's line under the table."""

    runs: int
    reached: int
    reached_then_failed: int = 0  # of `reached`: runs that failed afterwards (a target met is no success)
    fastest: tuple | None = None  # (run_id, time_to_target_s or wall_to_target_s)
    cheapest: tuple | None = None  # (run_id, usd_to_target)
    total_usd: float | None = None
    unfinished_attempts_usd: float | None = (
        None  # instances of attempts that did not finish (interrupted, lost, failed)
    )
    pruned_usd: float | None = None  # everything pruned runs cost
    on_demand_usd: float | None = None  # the same instance hours at on-demand prices

    def words(self) -> list[str]:
        failed = f" ({self.reached_then_failed} of them before failing)" if self.reached_then_failed else ""
        out = [f"target: {self.reached} of {self.runs} runs reached it{failed}"]
        if self.fastest:
            out.append(f"fastest {self.fastest[0]} in {self.fastest[1]:.1f} s")
        if self.cheapest:
            out.append(f"cheapest {self.cheapest[0]} for {usd(self.cheapest[1])}")
        line = "; ".join(out)
        if self.total_usd is not None:
            line += (
                f". Spent {usd(self.total_usd)} in all: {usd(self.unfinished_attempts_usd or 0)} on attempts that did "
                "not "
                f"finish (interrupted or failed), {usd(self.pruned_usd or 0)} on pruned runs"
            )
            if self.on_demand_usd:
                saved = self.on_demand_usd - self.total_usd
                line += (
                    f"; on demand the same hours would have cost {usd(self.on_demand_usd)} "
                    f"(saved {usd(saved)}, {saved / self.on_demand_usd:.0%}; on-demand prices are approximate)"
                )
        return [line + "."]


def economics(rows, ledger: dict[str, dict] | None, attempts: dict[str, int], costs: Costs | None = None) -> Economics:
    """`rows`: RunResults with their ToTarget filled; `attempts`: each run's last attempt; `costs`: how the backend's
    ledger reads in dollars (None: it keeps none)."""
    reached = [r for r in rows if r.to_target.reached]
    timed = [
        (
            r.run_id,
            r.to_target.time_to_target_s if r.to_target.time_to_target_s is not None else r.to_target.wall_to_target_s,
        )
        for r in reached
    ]
    timed = [t for t in timed if t[1] is not None]
    priced = [(r.run_id, r.to_target.usd_to_target) for r in reached if r.to_target.usd_to_target is not None]
    eco = Economics(
        runs=len(rows),
        reached=len(reached),
        reached_then_failed=sum(r.state == "failed" for r in reached),
        fastest=min(timed, key=lambda t: t[1]) if timed else None,
        cheapest=min(priced, key=lambda t: t[1]) if priced else None,
    )
    if ledger is None or costs is None:
        return eco
    eco.total_usd = costs.total(ledger)
    pruned = {r.run_id for r in rows if r.state == "pruned"}
    eco.unfinished_attempts_usd = sum(
        usd_until([e], e["run"])
        for e in ledger.values()
        if e.get("run") and e.get("attempt") and e["attempt"] < attempts.get(e["run"], 0)
    )
    eco.pruned_usd = sum(usd_until(entries_of(ledger, rid), rid) for rid in pruned)
    on_demand = 0.0
    for e in ledger.values():
        hours = max(0.0, float(e.get("end") or 0) - float(e.get("start") or 0)) / 3600
        price = float(e.get("price_per_h") or 0.0)
        od = (
            costs.on_demand(e.get("type", ""), price, *([e["region"]] if e.get("region") else []))
            if e.get("market") == "spot"
            else price
        )
        on_demand += hours * (od or price)
    eco.on_demand_usd = on_demand
    return eco
