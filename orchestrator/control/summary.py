"""The sweep's summary record, `<sweep>/summary.json`: one request tells `orch status` what every run is doing.

The controller writes it in a pass that changed something (and at least every REFRESH_S while runs
are active): counts per state, spend, and one compact row per run. Readers trust its final rows
(a final run never changes again) and its queued rows, and re-read only the records of live runs,
of runs with a host, and of runs someone touched outside the controller (`orch cancel` leaves a
marker under `<sweep>/.orch-touched/`), so `orch status` costs O(active runs) at any sweep size.
A summary that cannot be read is ignored: the reader falls back to reading every record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, fields

from orchestrator.contract import finite
from orchestrator.control.views import Progress, RunView
from orchestrator.store.base import Store, get_json
from orchestrator.store.layout import summary_key, touched_key, touched_prefix, touched_run_prefix, touched_runs

VERSION = 1
REFRESH_S = 30.0  # an unchanged summary is still rewritten this often while runs are active (elapsed, metrics)
_FIELDS = {f.name for f in fields(RunView)}


def target_of(target) -> dict | None:
    """The `target:` the rows' `reached` marks were computed against (None: no target)."""
    return None if target is None else {"metric": target.metric, "value": target.value, "mode": target.resolved_mode()}


def build(progress: Progress) -> dict:
    return {
        "version": VERSION,
        "target": progress.target,
        "sweep": progress.sweep,
        "updated_at": time.time(),
        "done": progress.done,
        "counts": progress.counts(),
        "spend_usd": progress.spend_usd,
        "budget_usd": progress.budget_usd,
        "runs": [asdict(r) for r in progress.runs],
        **({"deadline": asdict(progress.deadline)} if progress.deadline is not None else {}),
    }


def write(store: Store, progress: Progress) -> None:
    data = json.dumps(build(progress), separators=(",", ":"), sort_keys=True, allow_nan=False, default=str)
    store.put_bytes(summary_key(progress.sweep), data.encode() + b"\n")


def document(store: Store, sweep: str) -> object:
    """summary.json as read (input: `rows` and `deadline_in` check it), None without one."""
    return get_json(store, summary_key(sweep))


def deadline_in(doc: object, sweep: str) -> dict | None:
    """The `deadline` the controller's last pass published (control/deadline.py reads it), None without one."""
    return doc.get("deadline") if isinstance(doc, dict) and doc.get("sweep") == sweep else None


def read(store: Store, sweep: str, run_ids: list[str], target=None) -> dict[str, RunView] | None:
    """The rows of the summary record: `rows` of what `document` reads."""
    return rows(document(store, sweep), sweep, run_ids, target)


def rows(doc: object, sweep: str, run_ids: list[str], target=None) -> dict[str, RunView] | None:
    """The rows of a summary, one per run of the sweep (runs it lacks show as queued), or None when
    there is none or it cannot be trusted (another version, another sweep, wrong types). Marks of a
    target other than `target` (a relaunch may change it) are dropped: `reached` is None there."""
    if (
        not isinstance(doc, dict)
        or doc.get("version") != VERSION
        or doc.get("sweep") != sweep
        or not isinstance(doc.get("runs"), list)
    ):
        return None
    found: dict[str, RunView] = {}
    try:
        for row in doc["runs"]:
            view = RunView(**{k: v for k, v in row.items() if k in _FIELDS})
            if not _row_ok(view):
                return None
            found[view.run_id] = view
    except (TypeError, AttributeError, ValueError):  # ValueError: a state this orch does not know
        return None
    if doc.get("target") != target_of(target):
        for view in found.values():
            view.reached = None
    from orchestrator.store.status import QUEUED

    return {
        rid: found.get(rid)
        or RunView(run_id=rid, state=QUEUED, attempt=0, failures=0, preemptions=0, elapsed=None, metrics={})
        for rid in run_ids
    }


def _number(value) -> bool:
    return value is None or finite(value) is not None


def _row_ok(view: RunView) -> bool:
    """Every field of a row read back has the type the controller writes (a row that does not is no row to show)."""
    counts = (view.attempt, view.failures, view.preemptions)
    return (
        isinstance(view.run_id, str)
        and all(isinstance(n, int) and not isinstance(n, bool) for n in counts)
        and _number(view.elapsed)
        and _number(view.finished_at)
        and isinstance(view.metrics, dict)
        and all(isinstance(k, str) for k in view.metrics)
        and isinstance(view.reason, str)
        and isinstance(view.log_tail, str)
        and (view.exit_code is None or (isinstance(view.exit_code, int) and not isinstance(view.exit_code, bool)))
        and isinstance(view.final, bool)
        and (view.reached is None or isinstance(view.reached, bool))
    )


def touch(store: Store, sweep: str, run_id: str) -> None:
    """Say that a run's record changed outside the controller (readers of the summary re-read it)."""
    store.put_bytes(touched_key(sweep, run_id), f"{time.time()}\n".encode())


def touched(store: Store, sweep: str) -> list[str]:
    """Run ids with a marker (one LIST)."""
    return touched_runs(sweep, store.list(touched_prefix(sweep)))


def untouch(store: Store, sweep: str, run_ids: Iterable[str]) -> None:
    for run_id in run_ids:
        store.delete_prefix(touched_run_prefix(sweep, run_id))
