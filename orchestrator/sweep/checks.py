"""Cross-field rules of sweep.yaml that pydantic cannot express: each problem is (location, message
with the fix); load.load_sweep turns them into errors that name file:line and field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from orchestrator.contract import bucket_problem, default_mode, session_name
from orchestrator.sweep.expand import expand, placeholders, run_count, seeds_of
from orchestrator.sweep.search import problems as search_problems
from orchestrator.sweep.search import space_keys
from orchestrator.sweep.spec import (
    BUILTINS,
    MAX_RUNS_CEILING,
    SweepSpec,
)
from orchestrator.sweep.spec_types import KEY_RE

Problems = list[tuple[tuple[Any, ...], str]]


def check(spec: SweepSpec, base: Path) -> Problems:
    """Cross-field rules pydantic cannot express, then those of the sweep's backend (`base`: the sweep file's folder);
    each problem is (location, message with fix)."""
    out = _key_problems(spec) + _grid_problems(spec) + _env_problems(spec) + _prune_problems(spec)
    if spec.search is not None:
        out += search_problems(spec)
    too_many = _count_problems(spec)
    if too_many:  # before anything is expanded: `seeds: 1000000000` must not allocate
        return out + too_many
    out += _seed_problems(spec) + _command_problems(spec) + _data_problems(spec) + _workdir_problems(spec)
    out += _backend_problems(spec) + spec.backends()[spec.backend].checks(spec, base)
    return out or _id_problems(spec)


def _key_problems(spec: SweepSpec) -> Problems:
    """Names of params, grid axes and a search's space: placeholders, never orch's own."""
    out: Problems = []
    for section, keys in ((("params",), spec.params), (("grid",), spec.grid), (("search", "space"), space_keys(spec))):
        for key in keys:
            if not KEY_RE.match(key) and section != ("search", "space"):  # (search.py says it for the space)
                out.append(((*section, key), f"not a valid name; use letters, digits and '_' (it becomes {{{key}}})"))
            if key in BUILTINS:
                out.append(
                    (
                        (*section, key),
                        f"'{key}' is reserved by orch; use the `seeds:` field for seeds"
                        if key == "seed"
                        else f"'{key}' is reserved by orch; rename it",
                    )
                )
    return out


def _grid_problems(spec: SweepSpec) -> Problems:
    """Each axis a list of distinct values, in params or grid but not both."""
    out: Problems = []
    for key, values in spec.grid.items():
        if not values:
            out.append((("grid", key), "empty list: a grid axis needs at least one value"))
        elif len({json.dumps(v) for v in values}) != len(values):
            out.append((("grid", key), "repeats a value; every value of an axis must differ"))
        if key in spec.params:
            out.append((("grid", key), f"'{key}' is also in params; keep it in one of the two"))
        # a command line ends at a NUL: the shell would run the run's command without the rest of the value
        out += [
            (("grid", key, i), "holds a NUL character, which no command line can carry; remove it")
            for i, v in enumerate(values)
            if isinstance(v, str) and "\0" in v
        ]
    if not spec.grid and "grid" in spec.model_fields_set:
        out.append((("grid",), "empty grid; give at least one axis, e.g. `lr: [0.1, 0.2]`, or remove `grid:`"))
    return out


def _env_problems(spec: SweepSpec) -> Problems:
    """`env:` keys are variable names."""
    out: Problems = []
    for key in spec.env:
        if not KEY_RE.match(key):
            out.append(
                (("env", key), "not a valid variable name; use letters, digits and '_', not starting with a digit")
            )
    return out


def _count_problems(spec: SweepSpec) -> Problems:
    """A sweep over `max_runs`, counted without expanding it."""
    out: Problems = []
    count = run_count(spec)
    where = ("seeds",) if len(spec.grid) == 0 else ("grid",)
    if count > MAX_RUNS_CEILING:
        out.append(
            (
                where,
                f"expands to {count} runs, over the {MAX_RUNS_CEILING:,} one sweep may hold (`max_runs:` goes no "
                "higher); shrink the grid or seeds, or split it into several sweeps",
            )
        )
    elif count > spec.max_runs:
        out.append(
            (
                where,
                f"expands to {count} runs, over the limit of {spec.max_runs}; shrink the grid or seeds, "
                f"or raise `max_runs:` (at most {MAX_RUNS_CEILING:,}) if you mean it",
            )
        )
    return out


def _seed_problems(spec: SweepSpec) -> Problems:
    """`seeds:` a count >= 1 or distinct seeds."""
    out: Problems = []
    seeds = seeds_of(spec)
    if isinstance(spec.seeds, int) and spec.seeds < 1:
        out.append((("seeds",), "must be a count >= 1 or a non-empty list of seeds"))
    elif not seeds:
        out.append((("seeds",), "empty list; give at least one seed, e.g. [0]"))
    elif len(set(seeds)) != len(seeds):
        out.append((("seeds",), "repeats a seed; every seed must differ"))
    return out


def _command_problems(spec: SweepSpec) -> Problems:
    """Every placeholder of the command names a param, a grid axis or a builtin."""
    out: Problems = []
    try:
        names = placeholders(spec.command)
        known = set(spec.params) | set(spec.grid) | set(space_keys(spec)) | set(BUILTINS)
        for name in names:
            if name not in known:
                out.append(
                    (
                        ("command",),
                        f"placeholder {{{name}}} has no param; add `{name}` to params, grid or search.space, "
                        f"or write {{{{{name}}}}} for a literal brace",
                    )
                )
    except ValueError as exc:
        out.append((("command",), f"{exc}; write {{{{ and }}}} for literal braces"))
    return out


def _data_problems(spec: SweepSpec) -> Problems:
    """`data:` sources orch can stage, each to a folder of its own inside the data folder."""
    out: Problems = []
    for i, entry in enumerate(spec.data or []):
        if entry.source.startswith("s3://"):
            problem = _bucket_of(entry.source)
            if problem:
                out.append((("data", i, "from"), f"not a valid s3://bucket/prefix/ URL: {problem}"))
    for i, entry in enumerate(spec.data or []):
        to = entry.to
        if not to.startswith(("/", "~")) and os.path.normpath(to).split(os.sep)[0] == "..":
            out.append(
                (
                    ("data", i, "to"),
                    f"{to!r} leaves orch's data folder; use a path inside it (e.g. `cifar10`) or an absolute one",
                )
            )
    first: dict = {}  # a folder however written (`x`, `./x`, `x/`) -> the entry that stages to it first
    data = spec.data or []
    on_host = spec.backends()[spec.backend].host_path
    for i, entry in enumerate(data):
        folder = os.path.normpath(on_host(entry.to))
        if folder in first:
            j = first[folder]
            out.append(
                (
                    ("data", i, "to"),
                    f"{entry.to!r} is the folder data[{j}] stages to ({data[j].to!r}); give each entry its own",
                )
            )
        first.setdefault(folder, i)
    return out


def _workdir_problems(spec: SweepSpec) -> Problems:
    """`setup:` only with a workdir (it runs in it). The folder itself is read at launch (control/code.py), not here:
    a sweep loaded elsewhere (a remote controller, `orch status FILE`) need not have it."""
    if spec.workdir is None and spec.setup:
        return [(("setup",), "runs in the workdir, and `workdir:` is null; give `workdir:` your project's folder")]
    return []


def _backend_problems(spec: SweepSpec) -> Problems:
    """Sections that belong to another backend, and an S3 store URL that cannot be one."""
    out: Problems = []
    known = spec.backends()
    if spec.budget_usd is not None and not known[spec.backend].counts_dollars:
        counting = ", ".join(n for n, b in known.items() if b.counts_dollars) or "none"
        out.append(
            (
                ("budget_usd",),
                f"a budget needs a backend that counts dollars ({counting}); backend {spec.backend} runs cost nothing "
                "orch can count; remove it",
            )
        )
    if spec.deadline is not None and not known[spec.backend].buys_markets:
        buying = ", ".join(n for n, b in known.items() if b.buys_markets) or "none"
        out.append(
            (
                ("deadline",),
                f"backend {spec.backend} buys no machines, so a deadline has nothing to buy to keep it (it moves runs "
                f"from spot to on-demand: {buying}); remove `deadline:`",
            )
        )
    elif spec.deadline is not None and spec.timeout_minutes is None:
        out.append(
            (
                ("deadline",),
                "a deadline needs `timeout_minutes:` (the longest one run may take): orch plans with it until runs "
                "of this sweep have finished and their own length is known; add it",
            )
        )
    for name, schema in known.items():
        # a section with a required field is given or absent; given for another backend, it is a mistake
        if name != spec.backend and schema.default() is None and spec.section(name) is not None:
            a = "an" if name[:1] in "aeiou" else "a"
            out.append(((name,), f"{a} {name} section with backend {spec.backend}; remove it or set `backend: {name}`"))
    problem = _bucket_of(spec.store) if spec.store.startswith("s3://") else None
    if problem:
        out.append((("store",), f"not a valid s3://bucket/prefix URL: {problem}"))
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", spec.store)
    if scheme and scheme.group(1) != "s3":  # else it would silently become a local folder named `S3:`
        out.append(
            (
                ("store",),
                f"{scheme.group(1)}:// is not a store orch knows: write s3://bucket/prefix (in lower case, as S3's "
                "bucket names are) or a folder",
            )
        )
    return out


def _bucket_of(url: str) -> str | None:
    """Why the bucket of an s3:// URL cannot be one (S3's naming rules), or None."""
    return bucket_problem(url[len("s3://") :].split("/", 1)[0])


def _id_problems(spec: SweepSpec) -> Problems:
    """Two runs with one id (or one tmux session name) would share a record: refused, naming both."""
    by_id: dict = {}
    by_session: dict = {}
    for run in expand(spec):
        if run.run_id in by_id:
            a, b = _values(spec, by_id[run.run_id]), _values(spec, run)
            return [
                (
                    ("grid",),
                    f"two runs get the same id {run.run_id!r} (from {a} and {b}): in run ids, characters other than "
                    "letters, digits, '.', '+' and '-' become '_', and 1 and \"1\" read alike; make the values differ "
                    "in letters, digits, '.', '+' or '-'",
                )
            ]
        by_id[run.run_id] = run
        name = session_name(spec.name, run.run_id)
        if name in by_session:
            return [
                (
                    ("grid",),
                    f"runs {by_session[name].run_id!r} and {run.run_id!r} get the same tmux session name {name!r} "
                    "(tmux names cannot hold '.', which becomes '_' there); make the values differ in letters, "
                    "digits, '+' or '-'",
                )
            ]
        by_session[name] = run
    return []


def _values(spec: SweepSpec, run) -> str:
    """A run's grid values as written in the file, e.g. `t: 'a b'`."""
    return ", ".join(f"{k}: {json.dumps(run.params[k], ensure_ascii=False)}" for k in spec.grid) or "no grid"


def _prune_problems(spec: SweepSpec) -> list[tuple[tuple[Any, ...], str]]:
    out: list[tuple[tuple[Any, ...], str]] = []
    if spec.target is not None and spec.target.mode is None and default_mode(spec.target.metric) is None:
        out.append(
            (
                ("target", "mode"),
                f"say `mode: max` or `mode: min`: '{spec.target.metric}' ends neither in acc nor in loss",
            )
        )
    p = spec.prune
    if p is None:
        return out
    metric = p.metric or (spec.target.metric if spec.target else None)
    if metric is None:
        out.append((("prune", "metric"), "name the metric to compare, e.g. `metric: test_acc` (or give `target:`)"))
    elif p.mode is None and not (spec.target and spec.target.metric == metric) and default_mode(metric) is None:
        out.append((("prune", "mode"), f"say `mode: max` or `mode: min`: '{metric}' ends neither in acc nor in loss"))
    if any(b <= a for a, b in zip(p.rungs, p.rungs[1:])):
        out.append((("prune", "rungs"), "must increase, e.g. [2, 4, 8]"))
    runs = run_count(spec)
    if p.min_runs > runs:
        out.append(
            (
                ("prune", "min_runs"),
                f"{'' if 'min_runs' in p.model_fields_set else 'the default '}{p.min_runs} is more than the "
                f"sweep's {runs} run(s): no rung could ever decide; "
                f"use at most {runs}, or remove `prune:`",
            )
        )
    t = spec.target
    if p.mode is not None and t is not None and t.metric == metric and p.mode != t.resolved_mode():
        said = f"`target.mode: {t.mode}`" if t.mode else f"{t.resolved_mode()} (target's default for '{metric}')"
        out.append(
            (
                ("prune", "mode"),
                f"{p.mode} contradicts {said} for the same metric '{metric}': a run would be pruned for "
                "what the target calls better. Remove `prune.mode` (it follows target) or make the two agree",
            )
        )
    if metric is not None and p.at == metric:
        out.append(
            (
                ("prune", "at"),
                f"'at' measures progress (e.g. epoch or step); it cannot be the compared metric '{metric}'",
            )
        )
    return out
