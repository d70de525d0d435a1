"""What the CLI's commands share: expected errors without tracebacks, resolving SWEEP and RUN arguments."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click
from rich.console import Console

from orchestrator.backends.base import Backend
from orchestrator.backends.registry import backend_for, backends_with_host, explain, load_sweep, sweep_from_record
from orchestrator.control.recorded import read_record
from orchestrator.control.state import State
from orchestrator.errors import NotFound, OrchError
from orchestrator.store import open_store
from orchestrator.store.base import Store
from orchestrator.sweep.spec import Sweep


def make_console():

    return Console(highlight=False, soft_wrap=True)


def expected_errors(fn):
    """Expected errors print their message and exit with their code; no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            err = explained(exc)
            if err is None:
                raise
            click.echo(f"error: {err}", err=True)
            sys.exit(err.exit_code)

    return wrapper


def explained(exc: BaseException) -> OrchError | None:
    """An expected failure in words: an OrchError as it is, a cloud's answer nobody turned into words yet
    (no credentials, say) explained by its backend; None for anything else (a bug, which keeps its traceback)."""
    if isinstance(exc, OrchError):
        return exc
    return explain(exc)


# --- resolving arguments ------------------------------------------------------------------------


def load_sweep_arg(arg: str) -> Sweep:
    """A sweep file path, or the name of a sweep launched from this machine."""

    if arg.endswith((".yaml", ".yml")) or os.sep in arg or Path(arg).is_file():
        return load_sweep(arg)
    rec = State().sweep(arg)
    data = read_record(open_store(rec.store_url), rec.name, f"sweep {arg!r} (launched from {rec.spec_path})")
    if data is None and Path(rec.spec_path).is_file():  # a launch still in its preflight: not recorded yet
        return load_sweep(rec.spec_path)
    if data is None:
        raise NotFound(
            f"sweep {arg!r}: its store {rec.store_url} has no sweep.json any more, and nothing of it can be read. "
            f"`orch forget {arg}` takes it off this machine's list; launching its file starts it anew."
        )
    return sweep_from_record(data, rec.spec_path)


def as_launched(sw: Sweep) -> Sweep:
    """The sweep of a file as its launch recorded it, where a launch did: a file edited since (its regions, its
    instance types) must not hide from `orch down` what the launch made. The record of the sweep launched from here
    under that name, else the one in the file's store; the file itself when neither exists or can be read."""
    try:
        if any(rec.name == sw.spec.name for rec in State().sweeps()):
            return load_sweep_arg(sw.spec.name)
        data = read_record(open_store(sw.store_url), sw.spec.name, str(sw.path))
        return sweep_from_record(data, str(sw.path)) if data is not None else sw
    except Exception as exc:  # a record or store that cannot be read: the file is all there is to go by
        if explained(exc) is None:
            raise
        return sw


def resolve_run(arg: str) -> tuple[Sweep, str]:
    """RUN or SWEEP/RUN -> (sweep, run id), searching the sweeps launched from here."""

    hosting = backends_with_host(arg)
    if hosting:  # a host's id (an instance's, say): the run on it
        for rec in State().sweeps():
            if rec.backend not in hosting:
                continue
            sweep = load_sweep_arg(rec.name)
            run_id = sweep_parts(sweep)[0].run_of_instance(arg)
            if run_id:
                return sweep, run_id
        raise NotFound(f"instance {arg} belongs to no running run of a sweep launched from here.")
    if "/" in arg:
        name, run_id = arg.split("/", 1)
        candidates = [load_sweep_arg(name)]
    else:
        run_id = arg
        candidates, unreadable = [], []
        for rec in State().sweeps():
            try:
                candidates.append(load_sweep_arg(rec.name))
            except Exception as exc:  # a sweep out of reach (its cloud's credentials, say) hides no other's runs
                err = explained(exc)
                if err is None:
                    raise
                unreadable.append(f"{rec.name}: {err}")
    hits = [s for s in candidates if any(r.run_id == run_id for r in s.runs)]
    if not hits:
        raise NotFound(
            f"no run {run_id!r} in {'that sweep' if '/' in arg else 'any sweep launched from here'}. List runs with "
            "`orch status SWEEP`." + (f" Not searched (out of reach): {'; '.join(unreadable)}." if unreadable else "")
        )
    if len(hits) > 1:
        names = ", ".join(f"{s.spec.name}/{run_id}" for s in hits)
        raise NotFound(f"run {run_id!r} exists in several sweeps; name one: {names}")
    return hits[0], run_id


def sweep_parts(sweep: Sweep) -> tuple[Backend, Store, State]:

    return backend_for(sweep), open_store(sweep.store_url), State()
