"""What curves.png draws, against what, and which runs it names (docs/reference/commands.md, `orch collect`).

An ML user looks at the sweep's own metric (target's, search's, prune's) and at accuracies and losses, against
epochs or elapsed time; a metric line also holds counters, constants and timestamps (`epoch`, `batch_size`,
`time`), which drawn as curves only crowd the picture. Those are drawn on request (`orch collect --metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import finite
from orchestrator.errors import OrchError

X_KEYS = ("epoch", "elapsed_s", "elapsed", "step")  # a panel's x axis: the first of these its lines carry
FAMILIAR = ("test_acc", "val_acc", "acc", "train_loss", "val_loss", "loss")  # first of the accuracies, the losses
MAX_PANELS = 12  # metrics drawn in curves.png, the sweep's own first
LINES = 10  # runs drawn as labelled lines in curves.png; the others are drawn faint, without legend entries


def curve_mode(name: str) -> str | None:
    """The documented rule: names ending in acc or accuracy are accuracies (higher is better), names ending in
    loss are losses (lower is better); any other name is neither (drawn only as the sweep's metric, or on request)."""
    low = name.lower()
    if low.endswith(("acc", "accuracy")):
        return "max"
    return "min" if low.endswith("loss") else None


@dataclass
class Figure:
    """What curves.png shows (also written to runs.json and said by `orch collect`)."""

    metrics: list[str]  # one panel each, in order
    left_out: list[str] = field(default_factory=list)  # chosen, but past MAX_PANELS
    not_drawn: list[str] = field(default_factory=list)  # other numeric metrics: `--metrics` draws them
    ranked_by: tuple[str, str] | None = None  # (metric, max|min) that picks the labelled runs; None: sweep order
    labelled: list[str] = field(default_factory=list)  # run ids drawn as labelled lines, best first
    skipped: str = ""  # why curves.png was not drawn (values matplotlib cannot place), else empty


def choose(names: list[str], goals: list[tuple[str, str]], wanted: list[str] | None) -> Figure:
    """The panels for metrics `names` (numeric, in the order the lines name them): `wanted` when given (an error
    names the metrics there are), else the sweep's `goals` and the accuracies and losses."""
    if wanted:
        unknown = [w for w in wanted if w not in names]
        if unknown:
            raise OrchError(
                f"--metrics: no run logged {', '.join(unknown)}. The numeric metrics are: {', '.join(names[:40])}"
                + (f" and {len(names) - 40} more" if len(names) > 40 else ""),
                exit_code=2,
            )
        chosen = list(dict.fromkeys(wanted))
    else:
        own = [m for m, _ in goals if m in names]
        rule = [n for n in names if curve_mode(n) is not None and n not in own]
        rule.sort(key=lambda n: (curve_mode(n) != "max", FAMILIAR.index(n) if n in FAMILIAR else len(FAMILIAR)))
        chosen = list(dict.fromkeys(own + rule))
    rest = [n for n in names if n not in chosen and n not in X_KEYS]
    return Figure(metrics=chosen[:MAX_PANELS], left_out=chosen[MAX_PANELS:], not_drawn=rest)


def rank_metric(names: list[str], goals: list[tuple[str, str]]) -> tuple[str, str] | None:
    """What decides the best runs: the sweep's own metric (target, search, prune), else its first accuracy,
    else its first loss (a training loss last: it says least about a model); None when none is logged."""
    for metric, mode in goals:
        if metric in names:
            return metric, mode
    accs = [n for n in names if curve_mode(n) == "max"]
    losses = sorted((n for n in names if curve_mode(n) == "min"), key=lambda n: n.lower().startswith("train"))
    ordered = sorted(accs, key=lambda n: FAMILIAR.index(n) if n in FAMILIAR else len(FAMILIAR)) + losses
    return (ordered[0], curve_mode(ordered[0]) or "max") if ordered else None


def best_value(curves: list[dict], metric: str, mode: str) -> float | None:
    values = [v for v in (finite(line.get(metric)) for line in curves) if v is not None]
    return (max if mode == "max" else min)(values) if values else None


def rank_runs(runs: list, by: tuple[str, str] | None) -> list:
    """Runs best first by `by` (runs without a value of it last, in sweep order); sweep order without `by`."""
    if by is None:
        return list(runs)
    metric, mode = by
    sign = -1.0 if mode == "max" else 1.0

    def key(r) -> tuple[bool, float]:
        v = best_value(r.curves, metric, mode)
        return (v is None, sign * v if v is not None else 0.0)

    return sorted(runs, key=key)


def x_key(runs: list, metric: str) -> str | None:
    """A panel's x axis: the first of X_KEYS on every line that carries `metric`, else the one on most of them;
    None (the line's number) when none is."""
    lines = [line for r in runs for line in r.curves if finite(line.get(metric)) is not None]
    counts = {k: sum(finite(line.get(k)) is not None for line in lines) for k in X_KEYS}
    full = [k for k in X_KEYS if lines and counts[k] == len(lines)]
    if full:
        return full[0]
    most = max(X_KEYS, key=lambda k: counts[k])  # the first of the most-carried ones
    return most if counts[most] else None


def points(curves: list[dict], metric: str, x: str | None) -> list[tuple[float, float]]:
    out = []
    for i, line in enumerate(curves):
        y = finite(line.get(metric))
        at = finite(line.get(x)) if x is not None else float(i)
        if y is not None and at is not None:
            out.append((at, y))
    return out


def draw_png(title: str, runs: list, fig_spec: Figure, path: Path) -> None:
    """One panel per metric. The labelled runs are lines with a legend; every other run is one faint line in a
    single collection, so a sweep of thousands stays readable and fast to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = fig_spec.metrics
    n = len(metrics)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    order = {rid: i for i, rid in enumerate(fig_spec.labelled)}
    top = sorted((r for r in runs if r.run_id in order), key=lambda r: order[r.run_id])  # the legend: best first
    rest = [r for r in runs if r.run_id not in order]
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    try:
        for ax, metric in zip(axes.flat, metrics):
            _panel(ax, metric, top, rest, x_key(runs, metric))
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        legend = {}  # a run missing from the first panel still gets its legend entry
        for ax in axes.flat:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                legend.setdefault(label, handle)
        handles, labels = list(legend.values()), list(legend)
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
        fig.suptitle(title)
        fig.tight_layout(rect=(0, 0.06 + 0.02 * math.ceil(len(labels) / 4), 1, 1))
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _panel(ax: Any, metric: str, top: list, rest: list, x: str | None) -> None:
    from matplotlib.collections import LineCollection

    faint = [p for p in (points(r.curves, metric, x) for r in rest) if p]
    if faint:
        ax.add_collection(
            LineCollection(faint, colors="0.6", alpha=max(0.03, min(0.4, 20 / len(faint))), linewidths=0.6)
        )
        ax.autoscale_view()
    for r in top:
        pts = points(r.curves, metric, x)
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=r.run_id, marker="." if len(pts) < 30 else None)
    ax.set_title(metric)
    ax.set_xlabel(x or "metrics line")
    ax.grid(alpha=0.3)


def title(sweep: str, fig_spec: Figure, runs: int) -> str:
    more = ""
    if runs > len(fig_spec.labelled):
        by = f"best {len(fig_spec.labelled)} by {_by(fig_spec)}" if fig_spec.ranked_by else f"first {LINES}"
        more = f" ({by} labelled; {runs - len(fig_spec.labelled)} more in grey)"
    if fig_spec.left_out:
        more += f"; {len(fig_spec.left_out)} more metrics not drawn (runs.csv has them)"
    return f"sweep {sweep}{more}"


def _by(fig_spec: Figure) -> str:
    metric, mode = fig_spec.ranked_by or ("", "")
    return f"{metric} ({'higher' if mode == 'max' else 'lower'} is better)"
