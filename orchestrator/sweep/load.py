"""Loading a sweep: sweep.yaml (or the resolved spec kept in the store) -> a validated, expanded Sweep.

Every error names file:line, the field and a fix, and is raised before anything is launched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Union

import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.sweep.spec import Sweep, SweepSpec, expand, host_python, resolve_store
from orchestrator.sweep.yaml_errors import Loader, dotted, format_errors, line_of


def load_sweep(path: Union[str, Path]) -> Sweep:
    """Read, validate and expand a sweep file; raise SpecError naming file:line, field and fix."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: sweep file not found. Check the path (try `ls {path.parent or '.'}`).")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the sweep file: {exc}") from None
    try:
        root = yaml.compose(text, Loader=Loader)
        data = yaml.load(text, Loader=Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise SpecError(f"{where}: invalid YAML: {exc.problem}. Fix the syntax at that line.") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {exc}") from None
    except RecursionError:
        raise SpecError(f"{path}: the YAML is nested too deeply to be a sweep. Fix: flatten it (a sweep is a few levels deep).") from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{path}:1: the sweep must be a mapping of fields (name:, command:, grid: ...), not {kind}.")

    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError("\n".join(format_errors(exc, path, root, SweepSpec))) from None

    from orchestrator.sweep.checks import check

    problems = check(spec)
    if problems:
        raise SpecError("\n".join(f"{path}:{line_of(root, loc)}: {dotted(loc)}: {msg}" for loc, msg in problems))

    store_url = resolve_store(spec.store, path.parent)
    runs = expand(spec, python=host_python(spec))
    return Sweep(spec=spec, path=path.resolve(), store_url=store_url, runs=runs)



def sweep_from_record(record: Dict[str, Any], path: str) -> Sweep:
    """Rebuild a Sweep from the resolved spec kept in the store's sweep.json."""
    resolved = record.get("spec", {})
    fields_ = {k: v for k, v in resolved.items() if k in SweepSpec.model_fields}
    spec = SweepSpec.model_validate(fields_)
    return Sweep(spec=spec, path=Path(path), store_url=resolved.get("store", spec.store), runs=expand(spec, python=host_python(spec)))
