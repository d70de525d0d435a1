"""Store -> results: one row per run (params, final and best metrics), runs.csv, runs.json and curves.png."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.registry import costs_of
from orchestrator.contract import finite, keep_best
from orchestrator.control.curves import LINES, Figure, choose, draw_png, rank_metric, rank_runs, title
from orchestrator.control.target import Economics, ToTarget, economics, entries_of, to_target
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store, plain_json, read_jsonl
from orchestrator.store.status import read_status
from orchestrator.sweep.spec import Sweep

GB = 1024**3  # the GB of AWS's transfer prices (runs.csv's transfer_gb)

PREFERRED = ("epoch", "test_acc", "val_acc", "acc", "train_loss", "val_loss", "loss")
NOISE = ("lr", "images_per_s", "image_size", "step", "elapsed_s", "elapsed", "time")


METRIC_PREFIX = "metric."  # a metric named like a param or one of collect's own columns is kept under this prefix
OWN_COLUMNS = ("run_id", "state", "attempts", "reason")
PARAM_PREFIX = "param."  # likewise a param named like one of collect's own columns (any of COLUMNS, or best_*)
COLUMNS = (
    *OWN_COLUMNS,
    "elapsed_s",
    "cost_usd",
    "gpu_hours",
    "reached",
    "time_to_target_s",
    "wall_to_target_s",
    "usd_to_target",
    "trial_value",
    "region",
    "transfer_usd",
    "transfer_gb",
    "code",
)


def param_column(name: str) -> str:
    """The column of a param in runs.csv/runs.json: its name, unless collect has a column of that name (`state`,
    `best_test_acc`, …), which must keep saying what it says."""
    return PARAM_PREFIX + name if name in COLUMNS or name.startswith("best_") else name


def ranked(names) -> list[str]:
    """Metric names worth a column, the familiar ones first."""
    names = [n for n in names if n.removeprefix(METRIC_PREFIX) not in NOISE]
    return sorted(names, key=lambda n: (PREFERRED.index(n) if n in PREFERRED else len(PREFERRED), names.index(n)))


@dataclass
class RunResult:
    """One run as collected."""

    run_id: str
    state: str
    attempts: int
    params: dict[str, Any]
    final: dict[str, Any]  # last metrics line
    best: dict[str, float]  # max of each metric whose name ends in "acc", min of each "loss"
    elapsed_s: float | None
    curves: list[dict] = field(default_factory=list, repr=False)  # every metrics line
    cost_usd: float | None = None  # aws: every instance of every attempt (the sweep's cost ledger)
    gpu_hours: float | None = None  # aws: instance hours x GPUs of the type, summed the same way
    to_target: ToTarget = field(default_factory=ToTarget)  # with `target:`
    reason: str = ""  # why it ended so (pruned: the rung, its value and the cutoff)
    trial_value: float | None = None  # with `search:`: the value its trial told the sampler
    regions: list[str] = field(default_factory=list)  # aws: where its attempts ran, in attempt order (the ledger)
    transfer_usd: float | None = None  # aws: its attempts' data moved across regions, at AWS's inter-region rate
    transfer_bytes: int = 0  # the bytes those dollars are for
    code: str = ""  # `workdir:`: the snapshot its last attempt ran (sweep.json's `code`)


@dataclass(frozen=True)
class SearchInfo:
    metric: str  # what the trials' values are values of
    mode: str  # max | min
    space: list[str]  # the params the sampler chooses


@dataclass
class Results:
    sweep: str
    runs: list[RunResult]
    spend_usd: float | None = None  # the whole sweep (aws), wasted attempts and set-up included
    controller_usd: float | None = None  # of spend_usd: the remote controller's instances (`orch launch --remote`)
    transfer_usd: float | None = None  # aws: data moved between the store's region and runs elsewhere (not in spend)
    target: bool = False  # the sweep has `target:` (the to-target columns are shown)
    economics: Economics | None = None  # with `target:`: the summary line
    search: SearchInfo | None = None  # with `search:`
    goals: list[tuple[str, str]] = field(default_factory=list)  # (metric, max|min) of target, search and prune
    left_out: list[str] = field(default_factory=list)  # metrics curves.png does not draw (runs.csv has them all)
    # aws: the work bought per instance type (backends/aws/cloud/worth.py realized), when measured
    work: dict | None = None
    deadline: dict | None = None  # `deadline:` — met or not, dollars per market and the two estimates (deadline.py)
    figure: Figure | None = None  # what curves.png shows, once written

    def metric_names(self) -> list[str]:
        names: dict[str, None] = {}
        for r in self.runs:
            for k, v in r.final.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    names.setdefault(k, None)
        return list(names)


def _best(lines: list[dict]) -> dict[str, float]:
    best: dict[str, float] = {}
    for line in lines:
        for k, v in line.items():
            if finite(v) is not None:
                keep_best(best, k, v)
    return best


def _own_names(lines: list[dict], taken: set) -> list[dict]:
    """A metric named like a param (the trainer's logged `lr` in a sweep over `lr`) is renamed `metric.<name>`:
    the swept value keeps its column in the table, runs.csv and runs.json, and the metric is kept too."""
    if not any(k in taken for line in lines for k in line):
        return lines
    return [{(METRIC_PREFIX + k if k in taken else k): v for k, v in line.items()} for line in lines]


READERS = 16  # parallel reads: a status record and a metrics file per run


def collect(sweep: Sweep, store: Store) -> Results:
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.store.base import get_json

    reader = costs_of(sweep)
    ledger = get_json(store, layout.cost_key(sweep.spec.name)) if reader is not None else None
    costs = reader.per_run(ledger) if reader is not None and ledger is not None else {}
    places = reader.places(ledger) if reader is not None and ledger is not None else {}

    target = sweep.spec.target
    statuses = {}
    from orchestrator.control.trials import search_results

    specs, trial_values = search_results(sweep, store)
    # a search's params are the ones its trials were given (and its space names them before any is asked)
    space = list(sweep.spec.search.space) if sweep.spec.search is not None else []
    taken = {k for run in specs for k in run.params} | set(space) | set(OWN_COLUMNS)

    def one(run) -> RunResult:
        status = statuses[run.run_id] = read_status(store, sweep.spec.name, run.run_id)
        lines = read_jsonl(store.get_bytes(layout.metrics_key(sweep.spec.name, run.run_id)))
        reached = (
            to_target(
                target,
                lines,
                status.first_started_at,
                entries_of(ledger, run.run_id) if ledger is not None else None,
                run.run_id,
            )
            if target is not None
            else ToTarget()
        )
        lines = _own_names(lines, taken)
        moved = reader.transfer(ledger, run.run_id, status.moved) if reader is not None and ledger is not None else None
        return RunResult(
            run_id=run.run_id,
            state=status.state,
            attempts=status.attempt,
            params=run.params,
            final=lines[-1] if lines else {},
            best=_best(lines),
            elapsed_s=status.elapsed,
            curves=lines,
            cost_usd=costs.get(run.run_id, (0.0, 0.0))[0] if ledger is not None else None,
            gpu_hours=costs.get(run.run_id, (0.0, 0.0))[1] if ledger is not None else None,
            to_target=reached,
            reason=status.reason if status.state in ("pruned", "failed", "cancelled") else "",
            regions=[r for _, r in sorted(places.get(run.run_id, {}).items()) if r],
            transfer_usd=moved[0] if moved is not None else None,
            transfer_bytes=moved[1] if moved is not None else 0,
            code=status.code,
        )

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        runs = list(pool.map(one, specs))
    search = None
    if sweep.spec.search is not None:
        from orchestrator.sweep.search import objective

        goal = objective(sweep.spec)
        search = SearchInfo(goal.metric, goal.mode, space=list(goal.search.space))
        for r in runs:
            r.trial_value = trial_values.get(r.run_id)
        runs = by_trial_value(runs, search.mode)
    attempts = {rid: st.attempt for rid, st in statuses.items()}
    eco = economics(runs, ledger, attempts, reader) if target is not None else None
    return Results(
        sweep=sweep.spec.name,
        runs=runs,
        spend_usd=reader.total(ledger) if reader is not None and ledger is not None else None,
        controller_usd=(reader.controller(ledger) or None) if reader is not None and ledger is not None else None,
        transfer_usd=sum(r.transfer_usd or 0.0 for r in runs) if reader is not None and ledger is not None else None,
        target=target is not None,
        economics=eco,
        search=search,
        goals=goals_of(sweep.spec),
        work=_work(sweep, store, reader, ledger),
        deadline=_deadline(sweep, store, reader, ledger, statuses),
    )


def _deadline(sweep: Sweep, store: Store, reader, ledger: dict | None, statuses: dict) -> dict | None:
    """`deadline:`: whether it was met, and the dollars per market against all-spot and all-on-demand estimates."""
    import time

    from orchestrator.control import deadline
    from orchestrator.control.raised import budget_stopped
    from orchestrator.store.base import get_json
    from orchestrator.store.lifecycle import FINAL
    from orchestrator.store.status import FAILED

    if not sweep.spec.deadline:
        return None
    record = get_json(store, layout.sweep_key(sweep.spec.name))
    launched = record.get("launched_at") if isinstance(record, dict) else None
    at = deadline.moment(sweep.spec, float(launched) if isinstance(launched, (int, float)) else time.time())
    done = all(st.state in FINAL or st.state == FAILED for st in statuses.values())
    ends = [st.finished_at for st in statuses.values()]
    unrun = sum(1 for st in statuses.values() if budget_stopped(st))
    failures = sum(1 for st in statuses.values() if st.state == FAILED)
    out = {"deadline": at, "outcome": deadline.outcome(at or 0.0, ends, done, time.time(), unrun, failures)}
    if reader is not None and ledger is not None:
        out |= deadline.markets_bought(ledger, reader.on_demand)
    return out


def _work(sweep: Sweep, store: Store, reader, ledger: dict | None) -> dict | None:
    """aws: the work bought per type (rates.json's measured attempts against the ledger), when anything was measured."""
    from orchestrator.store.base import get_json

    if reader is None or reader.work is None or ledger is None:
        return None
    rates = get_json(store, layout.rates_key(sweep.spec.name))
    measured = rates.get("attempts") if isinstance(rates, dict) else None
    return reader.work(ledger, measured) if isinstance(measured, dict) and measured else None


def goals_of(spec) -> list[tuple[str, str]]:
    """The sweep's own metrics and which way each improves: target's, search's, prune's (in that order, each once)."""
    from orchestrator.control.prune import rule
    from orchestrator.sweep.search import objective

    out = []
    if spec.target is not None:
        out.append((spec.target.metric, spec.target.resolved_mode()))
    if spec.search is not None:
        goal = objective(spec)
        out.append((goal.metric, goal.mode))
    if spec.prune is not None:
        out.append(rule(spec))
    return list(dict.fromkeys(out))


def by_trial_value(runs: list[RunResult], mode: str) -> list[RunResult]:
    """Best trial first (then the order of the sweep); runs whose trial has no value last."""
    sign = -1.0 if mode == "max" else 1.0
    return sorted(runs, key=lambda r: (r.trial_value is None, sign * (r.trial_value or 0.0)))


def best_trial(res: Results) -> RunResult | None:
    return next((r for r in res.runs if r.trial_value is not None), None) if res.search else None


def write_outputs(results: Results, out_dir: Path, draw: bool = True, wanted: list[str] | None = None) -> list[Path]:
    """runs.csv, runs.json and (when there are metrics and `draw`) curves.png in out_dir; returns their paths.
    Drawing is most of the time this takes: a check of the tables alone passes `draw=False`."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        return _write(results, out_dir, draw, wanted)
    except OSError as exc:
        raise OrchError(
            f"cannot write results to {out_dir}: {exc.strerror or exc}. Pass another folder with `--out DIR`.",
            exit_code=2,
        ) from None


def _write(results: Results, out_dir: Path, draw: bool, wanted: list[str] | None) -> list[Path]:
    fig = results.figure = figure(results, wanted)  # first: an unknown `--metrics` name writes nothing
    results.left_out = fig.left_out
    metrics = results.metric_names()
    param_keys = list(dict.fromkeys(k for r in results.runs for k in r.params))
    rows = []
    for r in results.runs:
        row: dict[str, Any] = {"run_id": r.run_id, "state": r.state, "attempts": r.attempts}
        row.update({param_column(k): r.params.get(k) for k in param_keys})
        row.update({k: r.final.get(k) for k in metrics})
        row.update({f"best_{k}": v for k, v in r.best.items()})
        row["elapsed_s"] = None if r.elapsed_s is None else round(r.elapsed_s, 2)
        if r.cost_usd is not None:
            row["cost_usd"], row["gpu_hours"] = round(r.cost_usd, 4), round(r.gpu_hours or 0.0, 4)
            row["region"] = ",".join(dict.fromkeys(r.regions))  # each region once, in the order its attempts ran
        if r.transfer_usd is not None:
            row["transfer_usd"], row["transfer_gb"] = round(r.transfer_usd, 4), round(r.transfer_bytes / GB, 4)
        if results.target:
            t = r.to_target
            row["reached"] = t.reached
            row["time_to_target_s"] = None if t.time_to_target_s is None else round(t.time_to_target_s, 3)
            row["wall_to_target_s"] = None if t.wall_to_target_s is None else round(t.wall_to_target_s, 3)
            if r.cost_usd is not None:
                row["usd_to_target"] = None if t.usd_to_target is None else round(t.usd_to_target, 4)
        if results.search is not None:
            row["trial_value"] = r.trial_value
        if any(run.code for run in results.runs):
            row["code"] = r.code
        row["reason"] = r.reason
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    csv_path, json_path = out_dir / "runs.csv", out_dir / "runs.json"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    doc = {
        "sweep": results.sweep,
        "runs": rows,
        **({"spend_usd": round(results.spend_usd, 4)} if results.spend_usd is not None else {}),
        **({"controller_usd": round(results.controller_usd, 4)} if results.controller_usd is not None else {}),
        **({"transfer_usd": round(results.transfer_usd, 4)} if results.transfer_usd is not None else {}),
    }
    if results.work is not None:
        doc["work"] = results.work
    if results.deadline is not None:
        doc["deadline"] = results.deadline
    if results.economics is not None:
        doc["summary"] = {**asdict(results.economics), "words": results.economics.words()}
    best = best_trial(results)
    if best is not None and results.search is not None:
        doc["best_trial"] = {
            "run_id": best.run_id,
            "params": best.params,
            "value": best.trial_value,
            "metric": results.search.metric,
            "mode": results.search.mode,
        }
    png = out_dir / "curves.png"
    drawn = draw and bool(fig.metrics) and any(r.curves for r in results.runs) and _plot(results, fig, png)
    if not drawn:
        png.unlink(missing_ok=True)  # an earlier collect's picture would show what these results do not say
    if fig.left_out:
        doc["curves_left_out"] = fig.left_out
    if drawn:
        doc["curves"] = {"metrics": fig.metrics, "ranked_by": fig.ranked_by, "labelled": fig.labelled}
    json_path.write_text(json.dumps(plain_json(doc), indent=2, allow_nan=False) + "\n")
    return [csv_path, json_path, *([png] if drawn else [])]


def figure(results: Results, wanted: list[str] | None = None) -> Figure:
    """What curves.png draws for these results: `wanted` metrics, or the sweep's own and the accuracies and losses;
    the runs it names, best first by the sweep's metric."""
    names = results.metric_names()
    fig = choose(names, results.goals, wanted)
    fig.ranked_by = rank_metric(names, results.goals)
    fig.labelled = [r.run_id for r in rank_runs(results.runs, fig.ranked_by)[:LINES]]
    return fig


def _plot(results: Results, fig: Figure, path: Path) -> bool:
    """Draw curves.png; False (and `fig.skipped` says why) when matplotlib cannot, so the results are still
    written and shown: a metric at 1e308 then -1e308 spans more than a float holds, and matplotlib raises."""
    try:
        draw_png(title(results.sweep, fig, len(results.runs)), results.runs, fig, path)
    except Exception as exc:  # whatever matplotlib raises on values it cannot place, the table matters more
        fig.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}"
        return False
    return True
