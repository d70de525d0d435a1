"""What launch checks of the sweep's record in the store before it acts (a dry run checks the same)."""

from __future__ import annotations

from orchestrator.control import notify
from orchestrator.control.state import State
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store, get_json
from orchestrator.sweep import record as sweep_record
from orchestrator.sweep.spec import Sweep


def check_recorded(sweep: Sweep, store: Store, state: State) -> dict | None:
    """What launch checks before it acts (a dry run checks the same): the sweep's record in the store, which this
    orch must be able to continue (sweep/record.py) and which must give the runs what this file gives them; and the
    name, which must not move to another store. Read-only."""
    state.check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)
    notify.check(sweep)
    existing = get_json(store, layout.sweep_key(sweep.spec.name))
    if existing is not None and not isinstance(existing, dict):
        raise OrchError(
            f"{sweep.path}: the record of the sweep {sweep.spec.name!r} in {store.url} is not a sweep record (a "
            f"{type(existing).__name__}). Fix: give this sweep a new `name:`, or move that sweep.json aside.",
            exit_code=2,
        )
    if existing is not None:
        where = f"{sweep.path}: the sweep {sweep.spec.name!r} in {store.url}"
        sweep_record.check_schema(existing, where)
        changed = sweep_record.changes(existing, sweep)
        if changed:
            raise OrchError(
                f"{sweep.path}: a different sweep named {sweep.spec.name!r} already exists in {store.url} "
                f"(changed: {', '.join(changed)}). Its results are kept: give this sweep a new `name:`, "
                f"or restore the old settings to continue it.",
                exit_code=2,
            )
    return existing
