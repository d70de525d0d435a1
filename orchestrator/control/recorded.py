"""What launch checks of the sweep's record in the store before it acts (a dry run checks the same)."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.control import notify
from orchestrator.control.state import State
from orchestrator.errors import OrchError
from orchestrator.store import layout
from orchestrator.store.base import Store
from orchestrator.sweep import record as sweep_record
from orchestrator.sweep.spec import Sweep


def check_recorded(sweep: Sweep, store: Store, state: State) -> dict | None:
    """What launch checks before it acts (a dry run checks the same): the sweep's record in the store, which this
    orch must be able to continue (sweep/record.py) and which must give the runs what this file gives them; and the
    name, which must not move to another store. Read-only."""
    state.check_same_store(sweep.spec.name, str(sweep.path), sweep.store_url)
    notify.check(sweep)
    existing = read_record(store, sweep.spec.name, str(sweep.path))
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


def read_record(store: Store, name: str, where: str) -> dict[str, Any] | None:
    """The sweep's record in the store, None when it has none. A record is input: one that cannot be read as a sweep
    record (truncated, not JSON, not an object, no `spec` section, a folder) is refused, saying what is wrong, where,
    and the fix; taken as none, a relaunch would record a changed sweep over the runs of the old one."""
    key = layout.sweep_key(name)
    fix = (
        f"Fix: put back the sweep.json of the sweep {name!r} (from a backup), or move it aside and launch the sweep "
        "file again under a new `name:` (its runs' results stay where they are); `orch down FILE` stops it meanwhile."
    )
    try:
        data = store.get_bytes(key)
    except OSError as exc:  # a folder where the record should be, say
        raise OrchError(
            f"{where}: {store.url}/{key} cannot be read ({exc.strerror or exc}). {fix}", exit_code=2
        ) from None
    if data is None:
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise OrchError(
            f"{where}: {store.url}/{key} is not JSON ({len(data)} bytes: truncated, or not written by orch). {fix}",
            exit_code=2,
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("spec"), dict):
        what = f"a {type(record).__name__}" if not isinstance(record, dict) else "an object without a `spec` object"
        raise OrchError(f"{where}: {store.url}/{key} is not a sweep record ({what}). {fix}", exit_code=2)
    return record
