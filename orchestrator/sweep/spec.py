"""sweep.yaml -> validated SweepSpec: the models of every section, the run and the sweep as loaded.

The runs a spec expands to (grid x seeds, ids, commands) are made in expand.py.

Every error names file:line, the field and a fix, and is raised before anything is launched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from orchestrator.contract import default_mode, finite
from orchestrator.errors import OrchError
from orchestrator.sweep import deadline as deadlines
from orchestrator.sweep.notify import NotifySink
from orchestrator.sweep.search import SearchSection
from orchestrator.sweep.sections import Backends, BackendSchema, backends_of, raise_errors, section_errors
from orchestrator.sweep.spec_types import Amount, Count, Scalar, Strict
from orchestrator.sweep.workdir import DEFAULT_MAX_MB, Snapshot

# The bundled trainer reads ORCH_PARAMS_JSON, so every param and grid key becomes a trainer option.
DEFAULT_COMMAND = "{python} -m trainer"
# Placeholders every command may use besides its params.
BUILTINS = ("python", "sweep", "run_id", "seed", "torchrun")
AUTO_PYTHON = "auto"
MAX_RUNS = 10_000  # default limit on runs per sweep
# What `max_runs:` may raise it to: 10x the size the controller is measured at (docs/concepts/how-it-works.md).
MAX_RUNS_CEILING = 100_000
# Nodes per run: a cluster placement group of more is rare and a typo is likelier (docs/guides/packing-multi-node.md).
MAX_NODES = 64
MAX_GPUS = 16  # GPUs per node: the most any EC2 instance has (p2.16xlarge); 8 on every current GPU type
MAX_PROCS = 256  # processes per node
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
EXTRA = "Extra inputs are not permitted"  # pydantic's words for a key a section does not have


class ResourcesSection(Strict):
    """The shape of each run (docs/guides/packing-multi-node.md)."""

    nodes: Count = Field(1, ge=1, le=MAX_NODES, description=f"Instances (hosts) per run (at most {MAX_NODES}).")
    gpus: Count | None = Field(
        None,
        ge=0,
        le=MAX_GPUS,
        description=f"GPUs per node the run uses (default: every GPU of the host; at most {MAX_GPUS}).",
    )
    procs_per_node: Count | None = Field(
        None,
        ge=1,
        le=MAX_PROCS,
        description=f"Processes per node (default: gpus, or 1 without GPUs; at most {MAX_PROCS}).",
    )


class DataEntry(Strict):
    """A data set staged to each host before its runs start (docs/guides/data-and-images.md)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    source: str = Field(
        ..., alias="from", min_length=1, description="s3://bucket/prefix/, or (local backend) a folder."
    )
    to: str = Field(
        ..., min_length=1, description="Folder on the host (~ allowed); relative: under orch's data folder."
    )


class TargetSection(Strict):
    """When a run is good enough (docs/guides/targets.md)."""

    metric: str = Field(..., min_length=1, description="A key of the run's metrics lines, e.g. test_acc.")
    value: Amount = Field(..., description="The value to reach, e.g. 0.94.")
    mode: Literal["max", "min"] | None = Field(
        None, description="max: reached at >= value; min: at <= value. Default: max for *acc, min for *loss."
    )

    def resolved_mode(self) -> str:
        return self.mode or default_mode(self.metric) or "max"

    def met(self, line: dict[str, Any]) -> bool:
        v = finite(line.get(self.metric))
        if v is None:
            return False
        return v >= self.value if self.resolved_mode() == "max" else v <= self.value


class PruneSection(Strict):
    """Asynchronous successive halving across the sweep (docs/guides/pruning.md)."""

    metric: str | None = Field(
        None, min_length=1, description="The metric compared at each rung (default: target's metric)."
    )
    mode: Literal["max", "min"] | None = Field(
        None, description="max or min (default: from target, or the metric's name)."
    )
    at: str = Field(
        "epoch", min_length=1, description="The metrics key that measures progress (a rung is a value of it)."
    )
    rungs: list[Annotated[Amount, Field(gt=0)]] = Field(
        ..., min_length=1, description="Progress values where runs are compared, increasing (each above 0)."
    )
    keep: Amount = Field(0.34, gt=0, lt=1, description="The fraction of runs kept at each rung (the best ones).")
    min_runs: Count = Field(3, ge=1, description="No decision at a rung before this many runs have reported there.")


Section = TypeVar("Section", bound=BaseModel)  # a backend's section of sweep.yaml, as its own model


class SweepSpec(Strict):
    """One sweep: a command run once per point of `grid` x `seeds`."""

    name: str = Field(
        ..., pattern=NAME_RE, description="Sweep name: letters, digits, '-' and '_'; names the store folder."
    )
    description: str = Field("", description="Free text, shown by `orch status`.")
    # Each backend's section (`local:`, `aws:` ...) is no field here: `_backend_sections` validates it with the model
    # its backend declares, which the caller passes in the validation context (sweep/sections.py).
    model_config = ConfigDict(extra="allow")
    _backends: dict[str, BackendSchema] = PrivateAttr(default_factory=dict)

    backend: str = Field(
        "local", description="Where runs execute: a backend's name (local, aws, ssh; docs/backends.md lists them)."
    )
    command: str = Field(
        DEFAULT_COMMAND,
        min_length=1,
        description="Shell command of one run; {name} placeholders take params, grid values and builtins.",
    )
    params: dict[str, Scalar] = Field(default_factory=dict, description="Fixed values shared by every run.")
    grid: dict[str, list[Scalar]] = Field(
        default_factory=dict, description="Lists of values; the sweep runs their cartesian product."
    )
    seeds: StrictInt | list[StrictInt] = Field(
        1, description="A count N (seeds 0..N-1) or an explicit list of seeds; each point runs once per seed."
    )
    max_parallel: Count = Field(2, ge=1, description="How many runs execute at the same time.")
    max_restarts: Count = Field(1, ge=0, description="Restarts of a run whose command fails (preemptions are free).")
    timeout_minutes: Amount | None = Field(
        None, gt=0, description="A run still going after this is stopped and failed."
    )
    budget_usd: Amount | None = Field(
        None,
        gt=0,
        description="Backends that count dollars: once the realized cost reaches this, no new run or attempt starts.",
    )
    deadline: str | None = Field(
        None,
        description=(
            "aws: when every run must be done — a time with its zone (2026-12-11T18:00Z) or a duration from the first "
            "launch (90m, 36h, 2d); spot buys on-demand only when the schedule needs it (docs/guides/deadline.md)."
        ),
    )
    store: str = Field(
        "",
        description=(
            "Where results go: a folder (relative to this file) or s3://bucket/prefix. Default $ORCH_HOME/store."
        ),
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for every run.")
    max_runs: Count = Field(
        MAX_RUNS,
        ge=1,
        le=MAX_RUNS_CEILING,
        description=(
            f"Refuse the sweep when grid x seeds expands to more runs than this (a guard against typos); at most "
            f"{MAX_RUNS_CEILING:,}."
        ),
    )
    workdir: str | None = Field(
        ".",
        min_length=1,
        description=(
            "Your project's folder, relative to this file: its files are each run's current directory on every "
            "host (read-only; write to $ORCH_RUN_DIR). Default: the sweep file's folder; null: none."
        ),
    )
    workdir_max_mb: Amount = Field(
        DEFAULT_MAX_MB, gt=0, description="The most `workdir:` may hold, in MB (refused at launch when over)."
    )
    setup: str = Field(
        "",
        description="A command run once per host and code snapshot, in the workdir, before the first run there.",
    )
    data: list[DataEntry] | None = Field(None, description="Data sets staged to each host before the command starts.")
    resources: ResourcesSection | None = Field(
        None, description="The shape of each run: nodes, GPUs, processes per node."
    )
    target: TargetSection | None = Field(
        None, description="When a run is good enough: collect reports time and dollars to it."
    )
    prune: PruneSection | None = Field(None, description="Successive halving: stop runs that fall behind at each rung.")
    search: SearchSection | None = Field(
        None, description="Random or Bayesian search instead of a grid: trials a sampler proposes."
    )
    notify: list[NotifySink] | None = Field(
        None, description="Where the sweep tells what matters (failed, ended, target, best, budget, …): Apprise URLs."
    )

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return deadlines.parse(value).text
        except deadlines.BadDeadline as exc:
            raise PydanticCustomError("deadline", "{why}", {"why": str(exc)}) from None

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str, info: ValidationInfo) -> str:
        known = backends_of(info.context)
        if value not in known:
            raise PydanticCustomError(
                "unknown_backend",
                "unknown backend {name}; known backends: {known}",
                {"name": repr(value), "known": ", ".join(known) or "(none given)"},
            )
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _backend_sections(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        """The generic fields by pydantic, each backend's section by its own model; every error located."""
        known = backends_of(info.context)
        if not isinstance(data, dict):
            return handler(data)
        fields = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        unknown = [k for k in data if k not in fields and k not in known]
        spec, errors = None, list[ErrorDetails]()
        try:
            spec = handler({k: v for k, v in data.items() if k in fields})
        except ValidationError as exc:
            errors = exc.errors()
        sections, more = section_errors(data, known, info.context)
        errors += more + [{"type": "extra_forbidden", "loc": (k,), "input": data[k], "msg": EXTRA} for k in unknown]
        if errors or spec is None:  # spec is None only when the handler raised, with errors
            raise_errors(cls.__name__, errors)
        spec.__pydantic_extra__ = sections
        spec._backends = dict(known)
        return spec

    def section(self, name: str) -> Any:
        """The section of backend `name` (validated by its model), or None."""
        return (self.__pydantic_extra__ or {}).get(name)

    def section_as(self, name: str, model: type[Section]) -> Section:
        """The section of backend `name` as its model (a backend reads its own section so); refused when the spec has
        none (validated without that backend, or on another backend and the section has a required field)."""
        section = self.section(name)
        if not isinstance(section, model):
            raise OrchError(f"sweep {self.name!r} has no {name}: section (its backend is {self.backend})")
        return section

    def backends(self) -> Backends:
        """The backends this spec was validated against."""
        return self._backends

    def recorded(self) -> dict[str, Any]:
        """The spec as its record keeps it: every field and section, less what its backends leave out (e.g. where the
        controller runs is no part of what the runs do: a relaunch may change it)."""
        unrecorded: dict[str, Any] = {
            n: {f: True for f in b.unrecorded} for n, b in self._backends.items() if b.unrecorded
        }
        unrecorded["notify"] = True  # nor where it tells its user (`notify:` URLs are secrets: never in the store)
        return self.model_dump(mode="json", exclude=unrecorded)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep, fully resolved."""

    run_id: str  # readable and stable: grid values (and seed) joined, e.g. "lr=0.1,seed=0"
    params: dict[str, Any]  # params + this point's grid values + seed
    command: str  # the shell command with placeholders substituted


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep: the validated spec, where it came from, and its runs."""

    spec: SweepSpec
    path: Path  # the sweep file
    store_url: str  # resolved: absolute folder or s3:// URL
    runs: list[RunSpec] = field(default_factory=list)
    # The `workdir:` snapshot the runs get, as sweep.json records it (sweep/workdir.py Snapshot.summary()): filled by
    # the controller from the record (control/code.py), so every controller of the sweep gives the runs the same code.
    code: dict[str, Any] = field(default_factory=dict)
    snapshot: Snapshot | None = None  # the `workdir:` snapshot this launch took (control/code.py), else None

    def resolved(self) -> dict[str, Any]:
        """What is recorded as sweep.json; a relaunch must match it."""
        data = self.spec.recorded()
        data["store"] = self.store_url
        data["runs"] = [r.run_id for r in self.runs]
        data["grid_order"] = list(
            self.spec.grid
        )  # records are written with sorted keys; run ids follow the file's order
        if self.spec.search is not None:  # likewise the space's order (the order trials show their params in)
            data["space_order"] = list(self.spec.search.space)
        return data


# --- loading ----------------------------------------------------------------------------------


def host_python(spec: SweepSpec) -> str | None:
    """The interpreter `{python}` means: the one its backend's hosts name (None: this one's)."""
    schema = spec.backends().get(spec.backend)
    return schema.python(spec) if schema else None


def orch_home() -> Path:
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".orch")


def resolve_store(store: str, base: Path) -> str:
    if store.startswith("s3://"):
        return store.rstrip("/")
    if not store:
        return str(orch_home() / "store")
    p = Path(os.path.expanduser(store))
    return str((p if p.is_absolute() else base / p).resolve())
