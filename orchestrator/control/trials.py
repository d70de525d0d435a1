"""The controller's side of `search:`: a trial's params bound into its runs as it starts, its outcome told
once all its runs (one per seed) are final.

A trial is asked only when its first run is about to be claimed (so `max_parallel` trials are out at a
time and each ask knows every outcome told so far), and told exactly once: a succeeded trial its value
(the mean over its seeds), a pruned one its values at the rungs, a failed one FAIL.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from orchestrator.contract import finite
from orchestrator.control.study import Outcome, Study, parse_record
from orchestrator.control.views import RunView
from orchestrator.store.base import Store, read_jsonl
from orchestrator.store.layout import metrics_key, study_key
from orchestrator.store.lifecycle import RunState
from orchestrator.sweep.expand import bind
from orchestrator.sweep.search import objective, trial_number, trial_of
from orchestrator.sweep.spec import RunSpec, Sweep

log = logging.getLogger("orch.trials")


def trial_value(lines: list[dict], metric: str, mode: str, how: str) -> float | None:
    """The metric of one run: on its last line that has it (`last`), or its best (`best`); None without a finite
    one. `last` never looks past that line: a run whose last value is NaN diverged, and its trial is told FAIL."""
    if how == "last":
        had = [line[metric] for line in lines if line.get(metric) is not None]
        return finite(had[-1]) if had else None
    values = [v for v in (finite(line.get(metric)) for line in lines) if v is not None]
    if not values:
        return None
    return max(values) if mode == "max" else min(values)


class Trials:
    def __init__(self, sweep: Sweep, store: Store):
        self.sweep, self.store, self.name = sweep, store, sweep.spec.name
        goal = objective(sweep.spec)
        self.search, self.metric, self.mode = goal.search, goal.metric, goal.mode
        self.study = Study(store, self.name, self.search, self.mode, sweep.spec.max_parallel)
        self.runs_of: dict[int, list[str]] = {}
        for run in sweep.runs:
            self.runs_of.setdefault(trial_number(run.run_id), []).append(run.run_id)

    def bound(self, run: RunSpec, views: dict[str, RunView] | None = None) -> RunSpec:
        """The run with its trial's params (asked now if this is the trial's first start). An earlier trial not yet
        asked (its runs were cancelled while queued) is asked first and, its runs all final, told before the next
        ask: each ask knows every trial that ended before it."""
        number = trial_number(run.run_id)
        for earlier in range(len(self.study.record.trials), number):
            self.study.params_for(earlier)
            if views is not None:
                self.tell_finished(views, None)
        return bind(self.sweep.spec, run, self.study.params_for(number))

    def tell_finished(self, views: dict[str, RunView], rung_values: dict[str, dict[str, float]] | None) -> None:
        """Tell the sampler of every asked trial whose runs are all final (once each)."""
        for trial in self.study.record.trials:
            if self.study.told(trial.number):
                continue
            ids = self.runs_of.get(trial.number, [])
            runs = [v for v in (views.get(rid) for rid in ids) if v is not None]
            if not ids or len(runs) < len(ids) or any(not v.final for v in runs):
                continue
            self._tell(trial.number, runs, rung_values or {})

    def _tell(self, number: int, runs: list[RunView], rung_values: dict[str, dict[str, float]]) -> None:
        pruned = [v for v in runs if v.state == RunState.PRUNED]
        if pruned:
            inter = {rung: vals[pruned[0].run_id] for rung, vals in rung_values.items() if pruned[0].run_id in vals}
            self.study.tell(number, Outcome.PRUNED, intermediate=inter)
            return
        values = []
        for v in runs:
            if v.state != RunState.SUCCEEDED:
                continue
            lines = read_jsonl(self.store.get_bytes(metrics_key(self.name, v.run_id)))
            value = trial_value(lines, self.metric, self.mode, self.search.value)
            if value is None:
                log.warning(
                    "%s succeeded without a finite %s in its metrics lines: the trial counts as failed",
                    v.run_id,
                    self.metric,
                )
            else:
                values.append(value)
        if values and len(values) == len(runs):
            self.study.tell(number, Outcome.COMPLETE, value=sum(values) / len(values))
        else:
            self.study.tell(number, Outcome.FAIL)


def search_results(sweep: Sweep, store: Store) -> tuple[list[RunSpec], dict[str, float | None]]:
    """A search's runs with the params its study gave them (asked trials; the rest as they are), and each
    run's trial value as told to the sampler (None: not told, or no value). One read; asks nothing."""
    if sweep.spec.search is None:
        return list(sweep.runs), {}
    key = study_key(sweep.spec.name)
    data = store.get_bytes(key)
    trials = parse_record(data, key, sweep.spec.search).trials if data is not None else []
    runs, values = [], {}
    for run in sweep.runs:
        n = trial_of(run.run_id)
        asked = trials[n] if n is not None and n < len(trials) else None
        runs.append(bind(sweep.spec, run, asked.params) if asked is not None else run)
        values[run.run_id] = asked.value if asked is not None else None
    return runs, values


@dataclass(frozen=True)
class SearchProgress:
    """How far a search is (orch status): trials asked and told, and the best value told so far."""

    sampler: str
    trials: int  # in all
    asked: int
    told: int
    metric: str
    mode: str
    best: int | None = None  # the best trial's number
    best_value: float | None = None
    best_params: dict[str, object] = field(default_factory=dict)


def search_progress(sweep: Sweep, store: Store) -> SearchProgress:
    """One read of the study record."""
    goal = objective(sweep.spec)
    s = goal.search
    key = study_key(sweep.spec.name)
    data = store.get_bytes(key)
    trials = parse_record(data, key, s).trials if data is not None else []
    valued = [(t.value, t) for t in trials if t.value is not None]
    best = (max if goal.mode == "max" else min)(valued, key=lambda vt: vt[0])[1] if valued else None
    return SearchProgress(
        sampler=s.sampler,
        trials=s.trials,
        asked=len(trials),
        told=sum(1 for t in trials if t.outcome is not Outcome.ASKED),
        metric=goal.metric,
        mode=goal.mode,
        best=best.number if best else None,
        best_value=best.value if best else None,
        best_params=dict(best.params) if best else {},
    )
