"""The seam between a sweep and its backends: what the sweep layer knows of a backend, and nothing more.

A sweep names its backend (`backend: aws`) and may carry a section named after each backend (`aws: {...}`,
`local: {...}`). This layer cannot import `backends/` (the layers run cli > control > backends > ... > sweep), so it
never names one: the caller hands the known backends in, as `BackendSchema`s in pydantic's validation context
(`context={"backends": {...}}`; `backends/registry.py` builds them). `SweepSpec` validates `backend:` against their
names (an unknown one is refused with the list), each section with its backend's settings model (errors keep their
`aws.ssh.port` location, hence file:line), and the loader runs each backend's own checks after the generic ones.
A spec validated without backends knows none: it refuses every `backend:` and every section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

Problems = list[tuple[tuple[Any, ...], str]]
CONTEXT_KEY = "backends"


def _no_problems(spec: Any, base: Path) -> Problems:
    return []


def _no_python(spec: Any) -> str | None:
    return None


def _as_written(path: str) -> str:
    return path


def _section_as_written(section: Any) -> Any:
    return section


@dataclass(frozen=True)
class BackendSchema:
    """A backend as the sweep layer sees it: its name, its section of sweep.yaml and its checks."""

    name: str  # `backend: NAME`; also the key of its section
    settings: type[BaseModel]  # the model of its section; absent, the section is its defaults (None if it has none)
    # cross-field rules of a sweep on this backend (location, message with fix); `base`: the sweep file's folder
    checks: Callable[[Any, Path], Problems] = _no_problems
    python: Callable[[Any], str | None] = _no_python  # the interpreter `{python}` means on its hosts (None: ours)
    counts_dollars: bool = False  # it keeps a cost ledger: `budget_usd:` is allowed
    buys_markets: bool = False  # it buys spot or on-demand machines: `deadline:` is allowed (control/schedule.py)
    # a path as its hosts read it (local: `~` is this machine's home; elsewhere the host's, unknown here)
    host_path: Callable[[str], str] = _as_written
    unrecorded: tuple[
        str, ...
    ] = ()  # fields of its section that are no part of what the runs do (a relaunch may change)
    # its recorded section as a relaunch compares it: two spellings of one thing written one way (aws: the key file)
    compared: Callable[[Any], Any] = _section_as_written

    def default(self) -> BaseModel | None:
        """The section when the file leaves it out: its defaults, or None when it has a required field."""
        try:
            return self.settings()
        except ValidationError:
            return None


Backends = Mapping[str, BackendSchema]


def backends_of(context: Any) -> Backends:
    return (context or {}).get(CONTEXT_KEY) or {}


def section_errors(data: dict[str, Any], known: Backends, context: Any) -> tuple[dict[str, Any], list[ErrorDetails]]:
    """Each known backend's section validated (or defaulted), and the errors, located under the section's name."""
    sections: dict[str, Any] = {}
    errors: list[ErrorDetails] = []
    for name, schema in known.items():
        if data.get(name) is None:  # left out, or `aws: null` (a record of a sweep on another backend)
            sections[name] = schema.default()
            continue
        try:
            sections[name] = schema.settings.model_validate(data[name], context=context)
        except ValidationError as exc:
            errors.extend({**e, "loc": (name, *e["loc"])} for e in exc.errors())
    return sections, errors


def raise_errors(title: str, errors: Sequence[ErrorDetails]) -> NoReturn:
    """One ValidationError of errors gathered from several models, each kept as it was (type, place, message)."""
    # pydantic types PydanticCustomError's type and template as LiteralString (its guard against formatting user text);
    # these are types and messages pydantic or our validators already wrote, re-raised as they were
    details: list[InitErrorDetails] = [
        {"type": PydanticCustomError(e["type"], e["msg"]), "loc": e["loc"], "input": e.get("input")}  # pyright: ignore[reportArgumentType]
        for e in errors
    ]
    raise ValidationError.from_exception_data(title, details)
