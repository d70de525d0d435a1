"""`workdir:` at launch: the snapshot taken of the user's folder, checked against the sweep's record, put in the store
once, and what every controller of the sweep gives the runs (sweep.json's `code`).

A sweep runs one version of the code: a relaunch whose folder differs from the recorded snapshot continues with the
recorded one and says so, naming the files that changed (`note`) — a run's attempts never run two versions, and the
files a command or a tool writes beside the code (a log, `outputs/`) never make a relaunch fail. A controller that
did not take the snapshot (the background controller, `--remote`'s) gives the runs the recorded one too. A sweep
recorded by an orch before `workdir:` gets the snapshot its next launch takes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.control.recorded import read_record
from orchestrator.store import layout
from orchestrator.store.base import Store, get_json, put_json
from orchestrator.sweep.load import located
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.sweep.workdir import Snapshot, changed_files, take

SHOWN_CHANGES = 8


def with_snapshot(sweep: Sweep) -> Sweep:
    """The sweep with its `workdir:` snapshot taken now (None without a workdir); refused with file:line."""
    spec = sweep.spec
    if spec.workdir is None:
        return sweep
    folder = (sweep.path.parent / Path(spec.workdir).expanduser()).resolve()
    # what orch itself writes there: `orch collect`'s and `orch tensorboard`'s folder (results/<sweep>, from the
    # folder it is run in), the store, ORCH_HOME; none of it is code, and a relaunch must find the code unchanged
    outputs = Path("results") / spec.name
    excluded = [sweep.path, orch_home(), folder / outputs, Path.cwd() / outputs]
    if not sweep.store_url.startswith("s3://"):
        excluded.append(Path(sweep.store_url))
    snapshot = take(folder, located(sweep.path, ("workdir",)), excluded, spec.workdir_max_mb)
    return replace(sweep, snapshot=snapshot)


def note(sweep: Sweep, store: Store) -> str | None:
    """One line when this folder is not the code the sweep runs (a relaunch after an edit), else None. Read-only."""
    snap = sweep.snapshot
    recorded = _recorded(read_record(store, sweep.spec.name, str(sweep.path)))  # refused here as by the launch
    if snap is None or not recorded or recorded.get("digest") == snap.digest:
        return None
    before = get_json(store, layout.code_files_key(sweep.spec.name, str(recorded.get("digest"))))
    names = changed_files(before if isinstance(before, dict) else {}, snap.files)
    shown = ", ".join(names[:SHOWN_CHANGES]) + (f" and {len(names) - SHOWN_CHANGES} more" if len(names) > 8 else "")
    return (
        f"code: this folder changed since the sweep was launched ({shown or 'its files'}); its runs keep the code "
        f"they were launched with (snapshot {recorded.get('digest')}), so no run mixes two versions. To run the new "
        f"code, give the sweep a new `name:` (the results so far are kept)."
    )


def settle(sweep: Sweep, store: Store, existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """The code the runs get, into `sweep.code`: the recorded snapshot, or the one taken now (put in the store
    once). Returns the record with `code` added when it had none (a new sweep's record adds it itself)."""
    recorded = _recorded(existing)
    if recorded:
        sweep.code.update(recorded)
        return None
    if sweep.snapshot is None:
        return None
    put(store, sweep.spec.name, sweep.snapshot)
    sweep.code.update(sweep.snapshot.summary())
    return {**existing, "code": dict(sweep.code)} if existing is not None else None


def put(store: Store, name: str, snapshot: Snapshot) -> None:
    """The archive and its file list, unless the store has them (the same digest is the same bytes)."""
    key = layout.code_key(name, snapshot.digest)
    if not store.exists(key):
        put_json(store, layout.code_files_key(name, snapshot.digest), snapshot.files)
        store.put_bytes(key, snapshot.data)


def _recorded(existing: dict[str, Any] | None) -> dict[str, Any]:
    code = (existing or {}).get("code")
    return code if isinstance(code, dict) and isinstance(code.get("digest"), str) else {}
