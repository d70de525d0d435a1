"""Rich renderables for the CLI (tables of runs and sweeps). Builds, never prints."""

from __future__ import annotations

import time
from typing import Any

from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.cli.code_words import code_lines
from orchestrator.cli.work_words import deadline_words, work_words
from orchestrator.control.collect import Results, SearchInfo, best_trial, ranked
from orchestrator.control.curves import Figure
from orchestrator.control.prune import rule
from orchestrator.control.study import first_random_trials
from orchestrator.control.views import Progress, RunView, usd
from orchestrator.sweep.search import resolved_metric
from orchestrator.sweep.shapes import describe

STYLE = {
    "succeeded": "green",
    "failed": "red",
    "running": "cyan",
    "starting": "cyan",
    "queued": "dim",
    "cancelled": "yellow",
    "stopped": "yellow",
    "lost": "magenta",
    "interrupted": "magenta",
    "pruned": "yellow",
}
SHOWN_METRICS = 4


def fmt_seconds(s: Any) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


CUT = 60  # characters of a text (a metric's name, a string value) shown; runs.csv and the store keep them whole


def cut(text: str, limit: int = CUT) -> str:
    """Text as shown in a table or a line: one line, at most `limit` characters (a metrics line may hold megabytes
    of text, which folded into a table cell would print a hundred thousand lines)."""
    text = text[: limit + 1].replace("\r", "↵").replace("\n", "↵")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):  # numbers are never cut
        return str(v)
    return cut(str(v))


def metrics_text(m: dict[str, Any]) -> str:
    keys = ranked([k for k, v in m.items() if isinstance(v, (int, float, str))])
    return "  ".join(f"{cut(k)}={fmt_value(m[k])}" for k in keys[:SHOWN_METRICS])


def summary_line(p: Progress) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(p.counts().items()))


def spend_text(p: Progress) -> str:
    if p.budget_usd is None and not p.spend_usd:
        return ""
    return f"spent {usd(p.spend_usd)}" + (f" of budget {usd(p.budget_usd)}" if p.budget_usd is not None else "")


WHYS_SHOWN = 8  # live runs whose pool and its rank `orch status` names under its table


def runs_table(p: Progress, every: bool = False) -> Table:
    """Every active run and the newest finished ones (every run with `every`); the title counts them all."""
    spend = spend_text(p)
    rows = p.shown(every)
    hidden = len(p.runs) - len(rows)
    whys = [f"{r.run_id}: {r.why}" for r in rows if r.why and r.live][:WHYS_SHOWN]  # aws: where each went, why
    more = f"{hidden} more runs not shown (queued or finished earlier): `orch status {p.sweep} --all` lists every run"
    timely = [p.deadline.line(p.deadline.now)] if p.deadline is not None else []  # `deadline:`'s schedule
    caption = "\n".join(timely + ([more] if hidden else []) + whys) or None
    table = Table(
        title=f"sweep {p.sweep} — {summary_line(p)}" + (f" — {spend}" if spend else ""),
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    regions = any(r.region for r in p.runs)  # aws: the region each attempt runs in
    for col in ("run", "state", "attempt", *(["region"] if regions else []), "elapsed", "last metrics"):
        table.add_column(col, overflow="fold")
    for r in rows:
        state = Text(r.state, style=STYLE.get(r.state, ""))
        if r.state == "failed" and r.exit_code is not None:
            state.append(f" ({r.exit_code})")
        if r.reached:
            state.append(" ✓ target", style="bold green")
        note = (r.reason if r.state == "pruned" else "") or metrics_text(r.metrics) or (r.reason or "")
        where = [r.region or "-"] if regions else []
        table.add_row(r.run_id, state, str(r.attempt or "-"), *where, fmt_seconds(r.elapsed), note)
    return table


def failure_report(views: list[RunView]) -> list[str]:
    out = []
    for r in views:
        out.append(f"run {r.run_id} failed after {r.attempt} attempt(s): {r.reason}")
        out += [f"  | {line}" for line in r.log_tail.splitlines()[-10:]]
    return out


def _trial_cells(res: Results, r) -> dict[str, str]:
    """A search's columns: the value its trial told the sampler, then the params it was given."""
    if res.search is None:
        return {}
    cells = {"value": fmt_value(r.trial_value) if r.trial_value is not None else "-"}
    # a param named like one of the table's columns keeps its own (`param.state`), as in runs.csv
    own = ("run", "state", "time", "value")
    cells.update({(f"param.{k}" if k in own else k): fmt_value(r.params.get(k, "-")) for k in res.search.space})
    return cells


class SizedTable(Table):
    """A table that knows how wide its cells need it printed (ids, states and numbers are never cut)."""

    needed_width: int = 0


def results_table(res: Results, width: int = 200, wide: bool = False) -> SizedTable:
    """The results as a table that fits `width` columns: run ids and states are never cut (an id wraps);
    in a narrow terminal the optional columns go first (best-of, time, GPU-h, then metrics beyond two)
    unless `wide` (`orch collect --wide`)."""
    metrics = ranked(res.metric_names())[:4]
    costs = any(r.cost_usd is not None for r in res.runs)
    # machines of your own with no price given (ssh): GPU-hours, and no dollar column of zeros
    dollars = costs and bool(res.spend_usd or any(r.cost_usd for r in res.runs))
    moved = any(r.transfer_bytes for r in res.runs)  # some attempt ran outside the store's region
    title = f"results of sweep {res.sweep}" + (
        f" (spent {usd(res.spend_usd)} in all)" if res.spend_usd is not None and dollars else ""
    )
    rows = []
    for r in res.runs:
        cells = {"run": r.run_id, "state": r.state, "time": fmt_seconds(r.elapsed_s)}
        cells.update(_trial_cells(res, r))
        cells.update({m: fmt_value(r.final.get(m, "-")) for m in metrics})
        cells.update({f"best {m}": fmt_value(r.best.get(m, "-")) for m in metrics if m.endswith("acc")})
        if costs:
            cells.update(
                {"GPU-h": f"{r.gpu_hours or 0.0:.2f}"} | ({"$": usd(r.cost_usd or 0.0)[1:]} if dollars else {})
            )
            cells["region"] = ",".join(dict.fromkeys(r.regions)) or "-"
            if moved:
                cells["transfer $"] = f"{r.transfer_usd or 0.0:.4f}"
        if res.target:
            t = r.to_target
            cells["target"] = "yes" if t.reached else "no"
            cells["time to target"] = (
                fmt_seconds(t.time_to_target_s if t.time_to_target_s is not None else t.wall_to_target_s)
                if t.reached
                else "-"
            )
            cells["$ to target"] = f"{t.usd_to_target:.4f}" if t.usd_to_target is not None else "-"
        rows.append(cells)
    to_target = ["target", "time to target", *(["$ to target"] if costs else [])] if res.target else []
    trial_columns = list(_trial_cells(res, res.runs[0])) if res.runs else []
    columns = [
        "run",
        "state",
        *trial_columns,
        *metrics,
        *[f"best {m}" for m in metrics if m.endswith("acc")],
        *to_target,
        "time",
        *(["region", "GPU-h"] if costs else []),
        *(["$"] if dollars else []),
        *(["transfer $"] if moved else []),
    ]
    optional = [
        *[f"best {m}" for m in metrics if m.endswith("acc")],
        "time",
        *(["GPU-h", "region"] if costs else []),
        *metrics[2:][::-1],
    ]

    def need(cols) -> int:  # every column at its widest cell, plus borders and padding
        return sum(max([len(cut(c)), *(len(str(row[c])) for row in rows)]) for c in cols) + 3 * len(cols) + 1

    shown = list(columns)
    while not wide and optional and need(shown) > width:
        shown.remove(optional.pop(0))
    table = SizedTable(title=title, title_justify="left")
    for col in shown:
        table.add_column(col, overflow="fold") if col == "run" else table.add_column(cut(col), no_wrap=True)
    for cells in rows:
        table.add_row(*[Text(cells[c], style=STYLE.get(cells[c], "")) if c == "state" else cells[c] for c in shown])
    table.needed_width = need(shown)  # printed at least this wide: ids, states and numbers are never cut
    if len(shown) < len(columns):
        table.caption = (
            f"not shown (narrow terminal; --wide shows all): {', '.join(cut(c) for c in columns if c not in shown)}"
        )
    return table


def results_notes(res: Results) -> list[str]:
    """Under the results table: why runs were pruned, and with `target:` the sweep's time and dollars to it."""
    out = [f"{r.run_id}: {r.reason}" for r in res.runs if r.state == "pruned" and r.reason]
    if res.controller_usd is not None:
        out.append(
            f"controller: {usd(res.controller_usd)} of the spend (its on-demand instance, `orch launch --remote`)"
        )
    if res.transfer_usd:
        crossed = sum(r.transfer_bytes for r in res.runs) / 1024**3
        out.append(
            f"inter-region transfer: {usd(res.transfer_usd)} for {crossed:.3f} GB moved between the store's region and "
            "runs outside it (AWS's published rate per GB; not in the instance spend above): docs/guides/costs.md"
        )
    if res.economics is not None:
        out += res.economics.words()
    out += work_words(res.work)
    out += deadline_words(res.deadline)
    if res.search is not None:
        out.append(best_trial_words(res, res.search))
    return out


NOT_DRAWN_NAMED = 6  # metrics named in collect's line about curves.png (runs.csv has every one)


def curves_line(fig: Figure) -> str:
    """What curves.png shows (or why it was not drawn), and how to draw the rest."""
    if fig.skipped:
        return f"curves.png not drawn: matplotlib cannot draw these values ({cut(fig.skipped, 120)}); runs.csv has them"
    if not fig.metrics and not fig.not_drawn:
        return "curves.png not drawn: no run has logged a numeric metric"
    if not fig.metrics:
        example = cut(fig.not_drawn[0])
        return f"curves.png not drawn: no metric ends in acc, accuracy or loss; choose some, e.g. --metrics {example}"
    line = f"curves.png: {', '.join(cut(m) for m in fig.metrics)}"
    if fig.ranked_by is not None:
        metric, mode = fig.ranked_by
        line += f"; labelled: the best {len(fig.labelled)} by {cut(metric)} ({mode})"
    if fig.left_out:
        line += f"; {len(fig.left_out)} more chosen metrics left out (at most {len(fig.metrics)} panels)"
    if fig.not_drawn:
        named = ", ".join(cut(m) for m in fig.not_drawn[:NOT_DRAWN_NAMED])
        more = f" and {len(fig.not_drawn) - NOT_DRAWN_NAMED} more" if len(fig.not_drawn) > NOT_DRAWN_NAMED else ""
        line += f"; not drawn: {named}{more} (draw them with --metrics, e.g. --metrics {cut(fig.not_drawn[0])})"
    return line


def search_status_line(p) -> str:
    """orch status of a search: how many trials are asked and told, and the best so far."""
    line = f"search ({p.sampler}): {p.asked} of {p.trials} trials asked, {p.told} told"
    if p.best is None:
        return line + f"; no value of {p.metric} yet"
    params = ", ".join(f"{k}={fmt_value(v)}" for k, v in p.best_params.items())
    return line + f"; best so far trial={p.best} ({params}): {p.metric} {fmt_value(p.best_value)} ({p.mode})"


def best_trial_words(res: Results, search: SearchInfo) -> str:

    best = best_trial(res)
    metric, mode = search.metric, search.mode
    if best is None:
        return f"no trial has a value of {metric} yet"
    params = ", ".join(f"{k}={fmt_value(best.params[k])}" for k in search.space if k in best.params)
    return f"best trial: {best.run_id} ({params}): {metric} {fmt_value(best.trial_value)} ({mode})"


DRY_RUN_SHOWN = 50  # run lines a dry run prints without --all
RANDOM_SHOWN = 5  # a random search's first trials a dry run prints


def _dimension(dim) -> str:
    if dim.choices is not None:
        return "one of " + ", ".join(str(c) for c in dim.choices)
    kind = ", ".join(k for k, on in (("log", dim.log), ("int", dim.int_)) if on)
    return f"{dim.low:g} .. {dim.high:g}" + (f" ({kind})" if kind else "")


def search_lines(spec) -> list[str]:
    """A search's dry run: the sampler, the space and, for `random`, the first trials it will ask."""

    s = spec.search
    metric, mode = resolved_metric(spec)
    lines = [
        f"search: {s.sampler}, {s.trials} trials (seed {s.seed}), {spec.max_parallel} at a time; "
        f"optimizing {metric} ({mode}, its {s.value} value per run"
        + (
            ", the mean over seeds)"
            if len(spec.seeds if isinstance(spec.seeds, list) else range(spec.seeds)) > 1
            else ")"
        )
    ]
    lines += [f"  {name}: {_dimension(dim)}" for name, dim in s.space.items()]
    if s.sampler == "random":
        for n, params in enumerate(first_random_trials(s, RANDOM_SHOWN)):
            lines.append(f"  trial={n}: " + ", ".join(f"{k}={fmt_value(v)}" for k, v in params.items()))
        if s.trials > RANDOM_SHOWN:
            lines.append(f"  ... and {s.trials - RANDOM_SHOWN} more trials")
    else:
        lines.append("  trials are asked as slots free, each knowing the values told before it")
    lines.append(f"  each trial runs: {spec.command}")
    return lines


def dry_run_lines(sweep, plan: list[str] | None, every: bool = False, more_cost: tuple[str, ...] = ()) -> list[str]:
    """What `orch launch --dry-run` prints: the runs and their commands, then the backend's plan in words (its
    registry entry's `plan_lines`: aws's (type, AZ) choices with their prices and GPUs and a cost bound) with
    `more_cost` after it (what else the launch will spend, such as a remote controller's part), or without a plan
    each run's shape."""

    spec = sweep.spec
    lines = [
        f"sweep {spec.name}: {len(sweep.runs)} runs on backend {spec.backend}, max_parallel {spec.max_parallel}, store "
        f"{sweep.store_url}"
    ]
    shown = sweep.runs if every else sweep.runs[:DRY_RUN_SHOWN]
    if spec.search is not None:
        lines += search_lines(spec)
        shown = []
    lines += [f"  {run.run_id}: {run.command}" for run in shown]
    if shown and len(shown) < len(sweep.runs):
        lines.append(f"  ... and {len(sweep.runs) - len(shown)} more runs (`--all` prints every one)")
    if not plan:
        lines.append(f"each run: {describe(spec.resources)}")
    else:
        lines += plan
        lines += more_cost
    lines += goal_lines(spec)
    lines += code_lines(sweep.snapshot, spec.setup)
    lines.append("dry run: nothing launched.")
    return lines


def goal_lines(spec) -> list[str]:
    """What `target:` and `prune:` will do, one line each when set (the dry run shows them)."""
    out = []
    t = spec.target
    if t is not None:
        sign = ">=" if t.resolved_mode() == "max" else "<="
        out.append(f"target: {t.metric} {sign} {t.value:g}; collect reports each run's time and dollars to it")
    if spec.prune is not None:
        p = spec.prune
        metric, mode = rule(spec)
        rungs = ", ".join(f"{r:g}" for r in p.rungs)
        out.append(
            f"prune: compares {metric} ({'higher' if mode == 'max' else 'lower'} is better) at {p.at} {rungs}; a run "
            f"outside the best {p.keep:.0%} there is stopped, once {p.min_runs} runs have reported there"
        )
    return out


def watch_progress(con, run_fn):
    """Drive run_fn(on_progress) with a live table on a terminal, one line per change otherwise."""
    if con.is_terminal:
        with Live(console=con, refresh_per_second=4, transient=False) as live:
            return run_fn(lambda p: live.update(runs_table(p)))
    seen = {}

    def on_progress(p):
        for r in p.runs:
            key = (r.state, r.attempt, r.region)
            if seen.get(r.run_id) != key:
                seen[r.run_id] = key
                extra = f" ({r.reason})" if r.reason and r.state not in ("running", "starting") else ""
                where = f", {r.region}" if r.region else ""  # aws: the attempt's region, once the ledger has it
                con.print(
                    f"{time.strftime('%H:%M:%S')} {r.run_id}: {r.state} (attempt {r.attempt}{where}){extra}",
                    markup=False,
                )

    progress = run_fn(on_progress)
    con.print(runs_table(progress))
    return progress
