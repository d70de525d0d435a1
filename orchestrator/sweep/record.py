"""A sweep's record in the store (`<sweep>/sweep.json`): its schema, and what a relaunch may change.

A user who upgrades orch mid-sweep must be able to continue it. So the record carries a schema version;
a record from an older orch is read with every field it lacks at today's default (a field added later
is no change), and a relaunch is refused only where the runs would get something else: their commands,
params, environment, data, shape, backend settings, store, pruning, a search's study (raising its `trials` only
adds trials: allowed). What gives the same runs in another spelling is no change: `seeds: 2` as `[0, 1]`, a grid's
values in another order. `aws.ssh.identity` is compared as the file it names (`~` expanded), not as spelled.
A record from a newer orch than this one is refused: its fields may mean what this orch cannot know.

Schemas: 0 — before 2026-11-30, a run's records lay in its own folder (`<sweep>/<run>/status.json`);
this orch reads them nowhere, so such a sweep cannot be continued (it would run every run again).
1 — records without a `schema` key, written from then until this module. 2 — this module's.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from orchestrator.errors import OrchError
from orchestrator.sweep.sections import CONTEXT_KEY, Backends
from orchestrator.sweep.spec import Sweep, SweepSpec

SWEEP_SCHEMA = 2
# Change nothing a run gets (its command, params, env, shape, data): a relaunch may change them, and the record is
# brought up to date. `budget_usd` and `max_restarts` raised give back what the old ones ended (control/raised.py);
# `timeout_minutes` holds for attempts started after the relaunch. `target` only while `prune:` does not compare by it.
FREE = (
    "description",
    "max_parallel",
    "max_runs",
    "workdir_max_mb",
    "budget_usd",
    "max_restarts",
    "timeout_minutes",
    "deadline",
)
REPORT_ONLY = ("target",)


def schema_of(record: dict[str, Any]) -> int:
    """The record's schema; a record without one is 1, or 0 when it predates `max_runs` (the same commit that moved
    run records under `.orch/`)."""
    if "schema" in record:
        value = record["schema"]
        return value if isinstance(value, int) and not isinstance(value, bool) else SWEEP_SCHEMA + 1
    return 1 if "max_runs" in (record.get("spec") or {}) else 0


def check_schema(record: dict[str, Any], where: str, continuing: bool = True) -> None:
    """Refuse a record this orch cannot read: one from a newer orch; and, to continue it, one from before run records
    moved (reading it by name, for `orch status` or `orch down`, is harmless)."""
    schema = schema_of(record)
    if schema > SWEEP_SCHEMA:
        raise OrchError(
            f"{where}: recorded by a newer orch (sweep record schema {record.get('schema')!r}; this orch reads up to "
            f"schema {SWEEP_SCHEMA}). Upgrade orch (`pip install -U` it where you installed it) to continue this "
            "sweep, or give this sweep a new `name:`.",
            exit_code=2,
        )
    if schema == 0 and continuing:
        raise OrchError(
            f"{where}: recorded by an orch from before 2026-11-30, which kept each run's records in the run's own "
            "folder; this orch would not find them and would run every run again. Continue it with that orch, or "
            "give this sweep a new `name:` (its results stay where they are).",
            exit_code=2,
        )


def new_record(sweep: Sweep, launched_at: float) -> dict[str, Any]:
    record = {
        "schema": SWEEP_SCHEMA,
        "spec": sweep.resolved(),
        "launched_at": launched_at,
        "spec_file": str(sweep.path),
    }
    if sweep.code:  # `workdir:`'s snapshot: which code every run gets (control/code.py)
        record["code"] = dict(sweep.code)
    return record


def as_today(spec: dict[str, Any], backends: Backends) -> dict[str, Any]:
    """A recorded spec as this orch would record it: each field it lacks at its default, at every level.
    A record that no longer validates is compared as it is (a change of it is then named, as before)."""
    try:
        known = {k: v for k, v in spec.items() if k in SweepSpec.model_fields or k in backends}
        model = SweepSpec.model_validate(known, context={CONTEXT_KEY: backends})
    except ValidationError:
        return dict(spec)
    return {**spec, **model.recorded()}


def changes(record: dict[str, Any], sweep: Sweep) -> list[str]:
    """The fields of `sweep` that differ from its record in a way that changes what the runs get."""
    before, after = as_today(record.get("spec") or {}, sweep.spec.backends()), sweep.resolved()
    before, after = _as_meant(before, sweep.spec.backends()), _as_meant(after, sweep.spec.backends())
    if before.get("search") is None and after.get("search") is None:
        before, after = _as_runs(before), _as_runs(after)
    pruned = before.get("prune") is not None or after.get("prune") is not None
    extended = _extended(before, after)
    return sorted(
        name
        for k in set(before) | set(after)
        if before.get(k) != after.get(k)
        and k not in FREE
        and k not in extended
        and not (k in ("grid_order", "space_order") and k not in before)  # not recorded by an older orch: no change
        and not (k in REPORT_ONLY and not pruned)
        for name in _inside(k, before.get(k), after.get(k))
    )


def _as_meant(spec: dict[str, Any], backends: Backends) -> dict[str, Any]:
    """The spec with what two spellings may say alike written one way, as each backend's section says
    (`BackendSchema.compared`)."""
    return {k: backends[k].compared(v) if k in backends and isinstance(v, dict) else v for k, v in spec.items()}


def _as_runs(spec: dict[str, Any]) -> dict[str, Any]:
    """A grid sweep's runs written one way: `seeds: 2` as [0, 1], the seeds, each axis's values and the run ids in
    one order. Their order changes only the order the runs start in, never a run's id or params (the axes' own order
    does: it is the order of an id's parts, kept in `grid_order`)."""
    seeds, grid, runs = spec.get("seeds"), spec.get("grid"), spec.get("runs")
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = list(range(seeds))
    out = {**spec}
    if isinstance(seeds, list):
        out["seeds"] = sorted(seeds, key=json.dumps)
    if isinstance(grid, dict):
        out["grid"] = {k: sorted(v, key=json.dumps) if isinstance(v, list) else v for k, v in grid.items()}
    if isinstance(runs, list):
        out["runs"] = sorted(runs, key=json.dumps)
    return out


def _inside(key: str, before: Any, after: Any) -> list[str]:
    """The changed field's name, down to the fields of a section that changed (`aws.regions`, not `aws`)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [key]
    return [f"{key}.{k}" for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)] or [key]


def _extended(before: dict[str, Any], after: dict[str, Any]) -> tuple:
    """("search", "runs") when `after` only raises a search's `trials` (docs/guides/search.md: raising
    `trials`): the runs asked so far keep their ids and params, and new trials follow them. () otherwise."""
    b, a = before.get("search"), after.get("search")
    if not isinstance(b, dict) or not isinstance(a, dict) or {**b, "trials": 0} != {**a, "trials": 0}:
        return ()
    if not isinstance(b.get("trials"), int) or not isinstance(a.get("trials"), int) or a["trials"] < b["trials"]:
        return ()
    runs_before, runs_after = before.get("runs"), after.get("runs")
    if not isinstance(runs_before, list) or not isinstance(runs_after, list):
        return ()
    return ("search", "runs") if runs_after[: len(runs_before)] == runs_before else ()


def updated(record: dict[str, Any], sweep: Sweep) -> dict[str, Any] | None:
    """The record with the free and report-only fields as the file now says, or None when they are as recorded."""
    after = sweep.resolved()
    spec = record.get("spec") or {}
    news = {k: after.get(k) for k in FREE + REPORT_ONLY + _extended(spec, after) if spec.get(k) != after.get(k)}
    return {**record, "spec": {**spec, **news}} if news else None
