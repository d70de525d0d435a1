"""Asynchronous successive halving (ASHA) across a sweep's runs (`prune:` in sweep.yaml).

Li et al., "A System for Massively Parallel Hyperparameter Tuning" (2018); the anchors are Ray Tune's
ASHAScheduler and Optuna's SuccessiveHalvingPruner. When a run's progress (`at`, e.g. epoch) passes
a rung, its value of the metric there (on the first metrics line at or past the rung that carries
it) is compared with every value reported at that rung so far, its own included. With n values and
n >= min_runs, the cutoff is the k-th best, k = max(1, floor(n * keep)); a run worse than the cutoff
is pruned. Fewer than min_runs values: no decision, the run goes on. Order of arrival decides, as in
ASHA: an early run is judged against the runs that reached the rung before it.

The rung table lives in the store (`<sweep>/rungs.json`, written by the controller alone), so a
restarted controller keeps it, and a run never meets a rung's decision twice: a resumed attempt
that passes a rung again keeps the verdict its earlier attempt got there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.contract import default_mode, finite
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json
from orchestrator.sweep.spec import PruneSection, SweepSpec


@dataclass(frozen=True)
class Verdict:
    """A rung's decision on one run."""

    run_id: str
    rung: float
    value: float
    cutoff: float | None  # None: too few runs had reported there to decide
    reported: int  # runs with a value at this rung, this one included
    kept: bool
    best_k: int = 0  # how many of them the rung keeps

    def words(self, metric: str, at: str) -> str:
        return (
            f"pruned at {at} {self.rung:g}: {metric} {self.value:.4g} is worse than the cutoff {self.cutoff:.4g} "
            f"(the best {self.best_k} of the {self.reported} runs that reached that rung go on)"
        )


def rule(spec: SweepSpec) -> tuple[str, str]:
    """(metric, mode) that `prune:` compares: its own, else target's, else from the metric's name (load refuses a
    `prune:` whose metric cannot be told)."""
    p, target = _prune_of(spec), spec.target
    metric = p.metric or (target.metric if target else None)
    if metric is None:
        raise OrchError(f"sweep {spec.name!r}: `prune:` compares no metric; give `prune.metric:` or a `target:`")
    mode = (
        p.mode
        or (target.resolved_mode() if target and target.metric == metric else None)
        or default_mode(metric)
        or "max"
    )
    return metric, mode


def _prune_of(spec: SweepSpec) -> PruneSection:
    if spec.prune is None:
        raise OrchError(f"sweep {spec.name!r} has no `prune:`")
    return spec.prune


class Rungs:
    def __init__(self, store: Store, sweep: str, spec: SweepSpec):
        self.store, self.key = store, layout.rungs_key(sweep)
        self.p = _prune_of(spec)
        self.metric, self.mode = rule(spec)
        doc = get_json(store, self.key) or {}
        self.values: dict[str, dict[str, float]] = {}  # rung (as text) -> {run: value}
        for rung, runs in (doc.get("values") or {}).items() if isinstance(doc, dict) else []:
            if isinstance(runs, dict):
                self.values[str(rung)] = {r: float(v) for r, v in runs.items() if finite(v) is not None}
        self.pruned: dict[str, dict] = (
            {r: v for r, v in (doc.get("pruned") or {}).items()} if isinstance(doc, dict) else {}
        )

    def next_rung(self, run_id: str) -> float | None:
        """The first rung this run has not reported at yet (None: it has passed them all)."""
        for rung in self.p.rungs:
            if run_id not in self.values.get(_k(rung), {}):
                return rung
        return None

    def due(self, run_id: str, last_metrics: dict) -> bool:
        """Whether the run's newest line is past a rung it has not reported at (its lines are then worth reading)."""
        rung, progress = self.next_rung(run_id), finite(last_metrics.get(self.p.at))
        return rung is not None and progress is not None and progress >= rung and run_id not in self.pruned

    def observe(self, run_id: str, lines: list[dict], judge: bool = True) -> Verdict | None:
        """Record the run's value at each rung its lines passed; the first rung that prunes it, or None.
        `judge=False` (a run that already ended): its values count for later runs, no verdict on it."""
        return self._observe(run_id, lambda rung: _value_at(lines, self.p.at, self.metric, rung), judge)

    def observe_reported(self, run_id: str, at_rungs: dict[str, float], judge: bool = True) -> Verdict | None:
        """The same, from the values the agent reported at each rung (the record's `at_rungs`)."""
        return self._observe(run_id, lambda rung: finite(at_rungs.get(_k(rung))), judge)

    def due_reported(self, run_id: str, at_rungs: dict[str, float]) -> bool:
        """Whether the agent reported a value at a rung this run has not been compared at yet."""
        rung = self.next_rung(run_id)
        return rung is not None and _k(rung) in at_rungs and run_id not in self.pruned

    def _observe(self, run_id: str, value_at, judge: bool) -> Verdict | None:
        for rung in self.p.rungs:
            seen = self.values.setdefault(_k(rung), {})
            if run_id in seen:
                continue
            value = value_at(rung)
            if value is None:
                return None  # not there yet (or the metric is not on any line past it yet)
            seen[run_id] = value
            verdict = self._decide(run_id, rung, value, seen)
            if judge and not verdict.kept:  # the value and the verdict are written together
                self.pruned[run_id] = {
                    "rung": rung,
                    "value": value,
                    "cutoff": verdict.cutoff,
                    "reported": verdict.reported,
                    "kept": verdict.best_k,
                    "metric": self.metric,
                    "at": self.p.at,
                }
                self.save()
                return verdict
            self.save()
        return None

    def _decide(self, run_id: str, rung: float, value: float, seen: dict[str, float]) -> Verdict:
        n = len(seen)
        if n < self.p.min_runs:
            return Verdict(run_id, rung, value, None, n, True)
        k = max(1, math.floor(n * self.p.keep))
        best = sorted(seen.values(), reverse=self.mode == "max")
        cutoff = best[k - 1]
        kept = value >= cutoff if self.mode == "max" else value <= cutoff
        return Verdict(run_id, rung, value, cutoff, n, kept, k)

    def verdict_of(self, run_id: str) -> Verdict | None:
        """The pruning verdict a run got earlier (a resumed attempt keeps it)."""
        v = self.pruned.get(run_id)
        if not isinstance(v, dict) or finite(v.get("value")) is None or finite(v.get("cutoff")) is None:
            return None
        return Verdict(
            run_id,
            float(v.get("rung", 0)),
            float(v["value"]),
            float(v["cutoff"]),
            int(v.get("reported", 0)),
            False,
            int(v.get("kept", 0)),
        )

    def save(self) -> None:
        put_json(
            self.store,
            self.key,
            {
                "metric": self.metric,
                "mode": self.mode,
                "at": self.p.at,
                "rungs": list(self.p.rungs),
                "values": self.values,
                "pruned": self.pruned,
            },
        )


def _k(rung: float) -> str:
    return f"{rung:g}"


def _value_at(lines: list[dict], at: str, metric: str, rung: float) -> float | None:
    """The metric on the first line at or past the rung that carries it."""
    for line in lines:
        progress = finite(line.get(at))
        if progress is not None and progress >= rung:
            value = finite(line.get(metric))
            if value is not None:
                return value
    return None
