"""YAML with line numbers and duplicate-key checks, and pydantic errors as `file:line: field: message. Fix: ...`."""

from __future__ import annotations

import difflib
import json
import math
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails


class Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.MarkedYAMLError(
                problem=f"duplicate key '{key}' (first at line {seen[key] + 1})", problem_mark=key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# YAML 1.2 numbers: `1e-3` is a float (PyYAML follows YAML 1.1, which wants `1.0e-3`, and would hand a string to the
# run).
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    __import__("re").compile(r"^[-+]?(?:[0-9][0-9_]*)?(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def line_of(root: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """1-based line of the deepest node along `loc` (a pydantic error location)."""
    node, line = root, 1
    if node is not None:
        line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == str(part)]
            if not match:
                break
            key, node = match[0]
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def dotted(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not _is_tag(p)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "(top level)"


# Union members pydantic appends to error locations; they mean nothing to a user.
_TYPE_TAGS = {"bool", "int", "float", "str", "list[int]", "function-after[_check(), str]"}


def _is_tag(part: Any) -> bool:
    """A union member's tag in an error location (`function-after[forbid_inf_nan_check(), …]` too)."""
    return isinstance(part, str) and (part in _TYPE_TAGS or part.startswith(("function-after[", "function-before[")))


_FIXES = {
    "extra_forbidden": "remove it or fix its spelling; allowed here: {allowed}",
    "missing": "add it",
    "literal_error": "use one of the allowed values",
    "string_type": "write it as text, e.g. in quotes",
    "int_type": "write a whole number, e.g. 2",
    "int_parsing": "write a whole number, e.g. 2",
    "int_from_float": "write a whole number, e.g. 2",
    "float_type": "write a number, e.g. 0.5",
    "float_parsing": "write a number, e.g. 0.5",
    "finite_number": "write a finite number, e.g. 30",
    "bool_type": "write true or false",
    "list_type": "write a list, e.g. [0.1, 0.2]",
    "dict_type": "write a mapping of names to values",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
    "value_error": "see the message",
    "string_pattern_mismatch": "rename it",
    "string_too_short": "write something here",
    "too_short": "give at least one",
    "unknown_backend": "use one of the known backends (docs/backends.md says how to add one)",
}


def _model_of(annotation: Any) -> Any:
    """The pydantic model inside an annotation (Optional[X], List[X], X), or None."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _is_mapping(annotation: Any) -> bool:
    return typing.get_origin(annotation) is dict or any(_is_mapping(a) for a in typing.get_args(annotation))


def _allowed_fields(loc: tuple[Any, ...], root_model: Any, sections: dict[str, Any] | None = None) -> str:
    """The fields of the section the location is in (`resources.gpu` -> nodes, gpus, procs_per_node); `sections`:
    the top-level sections validated by models of their own (a backend's, by its name)."""
    model = _section_model(loc, root_model, sections or {})
    names = [f.alias or name for name, f in model.model_fields.items()]
    return ", ".join(names + (list(sections or {}) if model is root_model else []))


def _list_example(loc: tuple[Any, ...], root_model: Any, sections: dict[str, Any] | None) -> str:
    """A list as the field at `loc` takes it: its own example or default, else two items of its items' type."""
    model = _section_model(loc, root_model, sections or {})
    field = next((f for n, f in model.model_fields.items() if str(loc[-1]) in (n, f.alias)), None) if loc else None
    if field is None:
        return "[0.1, 0.2]"
    for given in [*(field.examples or []), field.default]:
        if isinstance(given, list) and given:
            return "[" + ", ".join(str(v) for v in given) + "]"
    items = [typing.get_args(a) for a in (field.annotation, *typing.get_args(field.annotation))]
    item = next((args[0] for args in items if args), None)
    item = typing.get_args(item)[0] if typing.get_origin(item) is typing.Annotated else item
    return {str: "[a, b]", int: "[1, 2]"}.get(item, "[0.1, 0.2]")  # type: ignore[arg-type]


def _section_model(loc: tuple[Any, ...], root_model: Any, sections: dict[str, Any]) -> Any:
    """The model of the section the location is in (the sweep's own when none fits)."""
    model: Any = root_model
    key_next = False  # the part after a mapping of models (search.space) is a key the user chose
    for part in loc[:-1]:
        if key_next or isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            key_next = False
            continue  # a list index or a mapping's key: the same model
        f = getattr(model, "model_fields", {}).get(part)
        model = _model_of(f.annotation) if f else (sections.get(part) if model is root_model else None)
        if model is None:
            model = root_model
            break
        key_next = f is not None and _is_mapping(f.annotation)
    return model


def _fix_from_input(err: ErrorDetails, fix: str) -> str:
    """A fix that names what to write, where the input says it: one value where a list goes (`[x]`), a name that
    matches its pattern once trimmed and in lower case."""
    given = err.get("input")
    if err["type"] == "list_type" and isinstance(given, (int, float)) and not isinstance(given, bool):
        return f"write a list, e.g. [{given}]"
    if not isinstance(given, str):
        return fix
    if err["type"] == "list_type" and given.strip():
        return f"write a list, e.g. [{given.strip()}]"
    said = re.search(r"pattern '(.+)'$", err.get("msg", ""))  # a backend's section re-raised keeps only the words
    pattern = (err.get("ctx") or {}).get("pattern") or (said.group(1) if said else None)
    if err["type"] == "string_pattern_mismatch" and pattern and re.fullmatch(pattern, given.strip().lower()):
        return f"write {given.strip().lower()}"
    return fix


def format_errors(
    exc: ValidationError, path: Path, root: yaml.Node | None, model: Any, sections: dict[str, Any] | None = None
) -> list[str]:
    """One line per field: file:line: field: message. Fix: ...; union alternatives merged. `sections`: top-level
    sections with models of their own (_allowed_fields)."""
    merged: dict[tuple[Any, ...], list[ErrorDetails]] = {}
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not _is_tag(p))
        merged.setdefault(loc, []).append(err)
    lines = []
    for loc, errs in list(merged.items())[:5]:
        err = errs[0]
        if loc == ("seeds",):
            msg = "must be a count (e.g. 3, for seeds 0, 1, 2) or a list of seeds (e.g. [0, 42])"
        elif len(errs) > 1:
            msg = "must be a number, a string or true/false" if err["type"] in _SCALAR_ERRORS else err["msg"]
        elif err["type"] == "string_pattern_mismatch" and loc == ("name",):
            too_long = isinstance(err.get("input"), str) and len(err["input"]) > 63
            msg = (
                "at most 63 characters"
                if too_long
                else "use letters, digits, '-' and '_', starting with a letter or digit"
            )
        elif err["type"] == "finite_number":
            msg = "must be a finite number"
        else:
            msg = err["msg"]
        given = _shown(loc, err.get("input"))
        if err["type"] not in ("extra_forbidden", "missing") and not isinstance(given, (dict, list)):
            msg += f" (got {given!r})"
        elif isinstance(given, (dict, list)) and err["type"] not in ("extra_forbidden", "missing"):
            msg += f" (got {json.dumps(given, ensure_ascii=False)[:60]})"
        fix = _FIXES.get(err["type"], "").format(allowed=_allowed_fields(loc, model, sections))
        if err["type"] == "list_type":
            fix = f"write a list, e.g. {_list_example(loc, model, sections)}"
        if err["type"] in ("float_type", "int_type") and _number_text(err.get("input")):
            fix = f"write the number without quotes: {err['input'].strip()}"
        fix = _fix_from_input(err, fix)
        if len(errs) > 1 and err["type"] in _SCALAR_ERRORS:  # none of a union's types: not one of them in particular
            fix = "write a number, text or true/false" + (" (null is not a value)" if err.get("input") is None else "")
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), _allowed_fields(loc, model, sections).split(", "), n=1)
            if close:
                fix = f"did you mean `{close[0]}`? Allowed here: {_allowed_fields(loc, model, sections)}"
        lines.append(f"{path}:{line_of(root, loc)}: {dotted(loc)}: {msg}" + (f". Fix: {fix}." if fix else ""))
    return lines


def _shown(loc: tuple[Any, ...], value: Any) -> Any:
    """An input as an error shows it: under `notify:` every URL redacted as in all of orch's output (a URL Apprise
    cannot read may still carry a webhook's secret path or a password)."""
    if not loc or loc[0] != "notify":
        return value
    if isinstance(value, dict):
        return {k: _shown(loc, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(loc, v) for v in value]
    if isinstance(value, str) and "://" in value:
        from orchestrator.sweep.notify import redacted

        return redacted(value)
    return value


def _number_text(value: Any) -> bool:
    """A string that reads as a number (`"0.9"`): a number put in quotes."""
    if not isinstance(value, str):
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


_SCALAR_ERRORS = {"bool_type", "int_type", "float_type", "string_type", "bool_parsing", "int_parsing", "float_parsing"}
