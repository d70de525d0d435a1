"""The `local:` section of sweep.yaml and the local backend's rules for a sweep, declared beside the backend (a module
of its own, so the registry names them without importing the backend's tmux parts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field

from orchestrator.sweep.sections import Problems
from orchestrator.sweep.spec import orch_home
from orchestrator.sweep.spec_types import Count, Strict

PROCS_PER_CORE = 4  # locally, nodes x procs_per_node may not exceed this many per CPU core


class LocalSection(Strict):
    """Settings of the local backend (`backend: local`)."""

    workdir: str | None = Field(None, description="Folder for the runs' working copies (default: $ORCH_HOME/work).")
    threads_per_run: Count | None = Field(
        None, ge=1, description="OMP/torch threads per run (default: CPU cores / max_parallel)."
    )


def check(spec: Any, base: Path) -> Problems:
    """Shapes this machine can hold, and `data: from:` folders here (relative to the sweep file's folder `base`)."""
    return _shape_problems(spec) + _local_sources(spec, base)


def _shape_problems(spec: Any) -> Problems:
    r = spec.resources
    if r is None:
        return []
    cores = os.cpu_count() or 1
    procs = r.nodes * (r.procs_per_node or max(1, r.gpus or 1))
    if procs <= cores * PROCS_PER_CORE:
        return []
    where = ("resources", "nodes") if r.nodes > 1 else ("resources", "procs_per_node")
    return [
        (
            where,
            f"{r.nodes} node(s) x {procs // r.nodes} process(es) = {procs} processes per run on this machine's "
            f"{cores} CPU core(s); locally at most {cores * PROCS_PER_CORE} ({PROCS_PER_CORE} per core). "
            f"Lower `nodes:` / `procs_per_node:`",
        )
    ]


def _local_sources(spec: Any, base: Path) -> Problems:
    """`data: from:` folders on this machine must be there (relative to the sweep file) before a run tries."""
    out: Problems = []
    for i, entry in enumerate(spec.data or []):
        if entry.source.startswith("s3://"):
            continue
        p = Path(os.path.expanduser(entry.source))
        p = p if p.is_absolute() else base / p
        if not p.exists():
            out.append(
                (
                    ("data", i, "from"),
                    f"{entry.source!r}: no such folder ({p}); give a folder on this machine or s3://bucket/prefix/",
                )
            )
        elif not p.is_dir():
            out.append((("data", i, "from"), f"{entry.source!r} is not a folder; give a folder or s3://bucket/prefix/"))
        else:
            out += _inside_source(spec, i, p.resolve())
    return out


def _inside_source(spec: Any, i: int, source: Path) -> Problems:
    """A `to:` at or under its own `from:` would copy the copy into itself, one level deeper each attempt."""
    to = spec.data[i].to
    if to.startswith(("/", "~")):
        dest = Path(os.path.expanduser(to))
    else:  # relative: under the work folder's .data/, as the local backend places it
        work = Path(os.path.expanduser(spec.local.workdir)) if spec.local.workdir else orch_home() / "work"
        dest = work / ".data" / to
    dest = dest.resolve()
    if dest != source and source not in dest.parents:
        return []
    return [
        (
            ("data", i, "to"),
            f"{to!r}{'' if str(dest) == to else f' ({dest})'} is {'' if dest == source else 'inside '}its own "
            f"`from:` folder {source}: each attempt would copy the copy into itself. Stage to a folder outside it",
        )
    ]
