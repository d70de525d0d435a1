"""Loading a sweep: sweep.yaml (or the resolved spec kept in the store) -> a validated, expanded Sweep.

Every error names file:line, the field and a fix, and is raised before anything is launched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.sweep.expand import expand
from orchestrator.sweep.record import check_schema
from orchestrator.sweep.sections import CONTEXT_KEY, Backends
from orchestrator.sweep.spec import Sweep, SweepSpec, host_python, resolve_store
from orchestrator.sweep.yaml_errors import Loader, dotted, format_errors, line_of


def load_sweep(path: str | Path, backends: Backends) -> Sweep:
    """Read, validate and expand a sweep file; raise SpecError naming file:line, field and fix.

    `backends`: the known ones (backends/registry.py passes them; this layer names none)."""
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
        raise SpecError(
            f"{path}: the YAML is nested too deeply to be a sweep. Fix: flatten it (a sweep is a few levels deep)."
        ) from None
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{path}:1: the sweep must be a mapping of fields (name:, command:, grid: ...), not {kind}.")

    try:
        spec = SweepSpec.model_validate(data, context={CONTEXT_KEY: backends})
    except ValidationError as exc:
        sections = {name: b.settings for name, b in backends.items()}
        raise SpecError("\n".join(format_errors(exc, path, root, SweepSpec, sections))) from None

    from orchestrator.sweep.checks import check

    problems = check(spec, path.parent)
    if problems:
        raise SpecError("\n".join(f"{path}:{line_of(root, loc)}: {dotted(loc)}: {msg}" for loc, msg in problems))

    store_url = resolve_store(spec.store, path.parent)
    runs = expand(spec, python=host_python(spec))
    return Sweep(spec=spec, path=path.resolve(), store_url=store_url, runs=runs)


def located(path: str | Path, loc: tuple) -> str:
    """`file:line: field` of a field of a sweep file, for an error found after loading (e.g. by asking AWS)."""
    try:
        line = line_of(yaml.compose(Path(path).read_text(), Loader=Loader), loc)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        line = 1
    return f"{path}:{line}: {dotted(loc)}"


def located_as(path: str | Path, section: str, names: tuple[str, ...]) -> str:
    """`located` of the first of `names` that the file's `section` spells (a field with two spellings, e.g. a value
    and a list of them); the first name when it spells none."""
    try:
        root = yaml.compose(Path(path).read_text(), Loader=Loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        root = None
    keys: list = []
    if isinstance(root, yaml.MappingNode):
        inner = [v for k, v in root.value if k.value == section]
        if inner and isinstance(inner[0], yaml.MappingNode):
            keys = [k.value for k, _ in inner[0].value]
    name = next((n for n in names if n in keys), names[0])
    return located(path, (section, name))


def sweep_from_record(record: dict[str, Any], path: str, backends: Backends) -> Sweep:
    """Rebuild a Sweep from the resolved spec kept in the store's sweep.json.

    Records are written with sorted keys, so the grid's order (which orders every run id's parts)
    comes from `grid_order`, or, in a record written before that field, from the recorded run ids.
    The runs must be exactly the recorded ones: a sweep named instead of given as a file must
    never address other runs than its file does (`orch down NAME` would miss them)."""
    check_schema(record, f"the sweep.json at {path}", continuing=False)
    resolved = record.get("spec", {})
    fields_ = {k: v for k, v in resolved.items() if k in SweepSpec.model_fields or k in backends}
    recorded = resolved.get("runs")
    order = resolved.get("grid_order") or _order_from_ids(recorded, list(fields_.get("grid") or {}))
    if isinstance(fields_.get("grid"), dict) and order and sorted(order) == sorted(fields_["grid"]):
        fields_["grid"] = {k: fields_["grid"][k] for k in order}
    space, space_order = (fields_.get("search") or {}).get("space"), resolved.get("space_order")
    if isinstance(space, dict) and isinstance(space_order, list) and sorted(space_order) == sorted(space):
        fields_["search"] = {**fields_["search"], "space": {k: space[k] for k in space_order}}
    try:
        spec = SweepSpec.model_validate(fields_, context={CONTEXT_KEY: backends})
    except ValidationError as exc:  # a record edited by hand, or damaged: input like any other
        raise SpecError(
            f"the record (sweep.json) of the sweep launched from {path} is not a valid sweep ({exc.error_count()} "
            f"error(s); first: "
            f"{dotted(exc.errors()[0]['loc'])}: {exc.errors()[0]['msg']}). Give the sweep file instead of its name "
            f"(`orch status FILE`), or put that sweep.json back as orch wrote it."
        ) from None
    sweep = Sweep(
        spec=spec,
        path=Path(path),
        store_url=resolved.get("store", spec.store),
        runs=expand(spec, python=host_python(spec)),
    )
    if isinstance(recorded, list) and [r.run_id for r in sweep.runs] != recorded:
        raise SpecError(
            f"the sweep.json of {spec.name} in {sweep.store_url} does not expand to the runs it records; "
            f"give the sweep file instead of its name (`orch status {path}`)"
        )
    return sweep


def _order_from_ids(run_ids: Any, keys: list) -> list:
    """The grid's keys in the order the first recorded run id names them (`lr=0.1,batch_size=64`)."""
    if not isinstance(run_ids, list) or not run_ids or not isinstance(run_ids[0], str):
        return []
    named = [part.split("=", 1)[0] for part in run_ids[0].split(",")]
    return [k for k in named if k in keys]
