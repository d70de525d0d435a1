"""sweep.yaml -> validated SweepSpec -> the runs it expands to.

Every error names file:line, the field and a fix, and is raised before anything is launched.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import (
    ConfigDict,
    Field,
    StrictInt,
)
from typing_extensions import Annotated

from orchestrator.contract import default_mode, finite
from orchestrator.sweep.search import SearchSection, trial_id
from orchestrator.sweep.spec_types import KEY_RE, Amount, Count, Scalar, Strict

# The bundled trainer reads ORCH_PARAMS_JSON, so every param and grid key becomes a trainer option.
DEFAULT_COMMAND = "{python} -m trainer"
# Placeholders every command may use besides its params.
BUILTINS = ("python", "sweep", "run_id", "seed", "torchrun")
AUTO_PYTHON = "auto"
MAX_RUNS = 10_000  # default limit on runs per sweep
MAX_RUNS_CEILING = 100_000  # what `max_runs:` may raise it to: 10x the size the controller is measured at (README)
MAX_NODES = 64  # nodes per run: a cluster placement group of more is rare and a typo is likelier (README: resources)
MAX_GPUS = 16  # GPUs per node: the most any EC2 instance has (p2.16xlarge); 8 on every current GPU type
MAX_PROCS = 256  # processes per node
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"


class LocalSection(Strict):
    """Settings of the local backend (`backend: local`)."""

    workdir: Optional[str] = Field(None, description="Folder for the runs' working copies (default: $ORCH_HOME/work).")
    threads_per_run: Optional[Count] = Field(
        None, ge=1, description="OMP/torch threads per run (default: CPU cores / max_parallel)."
    )


class SshSection(Strict):
    """How the controller reaches instances over SSH."""

    user: str = Field("ubuntu", description="Login user on the image.")
    port: Count = Field(22, ge=1, le=65535, description="sshd port.")
    address: Literal["public_ip", "private_ip"] = Field("public_ip", description="Which instance address to dial.")
    identity: str = Field(
        "~/.ssh/id_ed25519", description="Private key file; its .pub goes into the instance's authorized keys."
    )


class ControllerSection(Strict):
    """The instance a sweep's controller runs on with `orch launch --remote` (on demand, in the sweep's region).

    Its defaults follow tests/bench/test_bench_remote.py: a pass at 10,000 runs needs well under 1 GiB and a
    fraction of a CPU second, so the smallest burstable type serves (README: Sweeps that run unattended)."""

    instance_type: str = Field(
        "t3.micro", pattern=r"^[a-z0-9-]+\.[a-z0-9-]+$", description="EC2 type of the controller's instance."
    )
    image: Optional[str] = Field(
        None,
        min_length=1,
        description=(
            "AMI id or name pattern (owner `image_owner`); default: the newest Amazon Linux 2023 image of the type's "
            "architecture."
        ),
    )
    image_owner: str = Field("amazon", description="Owner of `image` when it is a name pattern.")
    python: str = Field(
        "python3.11",
        pattern=r"^[A-Za-z0-9_./+-]+$",  # a command name or path: it is run over SSH, however quoted
        description=(
            "Interpreter on the image (3.10 or newer) to run orch; installed with dnf and pip when missing (Amazon "
            "Linux 2023's python3 is 3.9)."
        ),
    )
    max_hours: Amount = Field(
        48, gt=0, le=24 * 30, description="Safety net: the controller's instance terminates itself after this."
    )


class AwsSection(Strict):
    """Settings of the aws backend (`backend: aws`)."""

    region: str = Field("us-east-1", description="AWS region.")
    instance_types: List[str] = Field(
        ["g5.xlarge", "g6.xlarge"],
        min_length=1,
        description=(
            "Acceptable instance types; EC2 picks among them by price and capacity (the order does not rank them: "
            "docs/aws.md)."
        ),
    )
    subnet_ids: List[str] = Field(
        default_factory=list, description="Subnets to launch into (one per AZ); default: the default VPC's."
    )
    image: str = Field(
        ..., min_length=1, description="An AMI id (ami-...) or a name pattern resolved to the newest match."
    )
    image_owner: str = Field("amazon", description="Owner of `image` when it is a name pattern.")
    market: Literal["spot", "on-demand", "spot-then-on-demand"] = Field("spot", description="Capacity market.")
    max_minutes: Count = Field(240, ge=5, description="Safety net: every instance powers off (terminates) after this.")
    security_group: Optional[str] = Field(None, description="Use this security group instead of creating one.")
    ssh_cidr: Optional[str] = Field(
        None, description="Who may reach port 22 (default: this machine's public address /32)."
    )
    instance_profile: Optional[str] = Field(
        "create",
        description=(
            "'create' (default): a profile limited to this sweep's S3 prefix and to terminating its own instances; or "
            "an existing profile's name."
        ),
    )
    python: str = Field(
        "auto",
        min_length=1,
        description=(
            "Interpreter on the instance ({python}); 'auto' finds the image's PyTorch interpreter (DLAMI: "
            "/opt/pytorch/bin/python) on the first host."
        ),
    )
    volume_gb: Count = Field(100, ge=8, description="Root volume size (deleted with the instance).")
    keep_alive: bool = Field(
        False, description="Keep an instance after its run ends (debugging); `orch down` removes it."
    )
    idle_minutes: Optional[Amount] = Field(
        None,
        gt=0,
        description=(
            "With keep_alive: the instance terminates itself once its run ended and nobody was attached for this long."
        ),
    )
    boot_timeout_s: Amount = Field(600, gt=0, description="How long to wait for an instance's sshd.")
    heartbeat_s: Amount = Field(
        60,
        gt=0,
        description=(
            "How often the agent writes status.json to S3 (a host silent for 180 s is lost: three beats fit; a "
            "rung, a notice and the end are written at once)."
        ),
    )
    sync_s: Amount = Field(
        120,
        gt=0,
        description=(
            "How often the agent syncs the run folder (metrics, log) to S3; a new checkpoint and a spot notice go at "
            "once."
        ),
    )
    ssh: SshSection = Field(default_factory=SshSection, description="SSH settings.")
    controller: ControllerSection = Field(
        default_factory=ControllerSection, description="The controller's own instance, for `orch launch --remote`."
    )


class ResourcesSection(Strict):
    """The shape of each run (README: Run shapes)."""

    nodes: Count = Field(1, ge=1, le=MAX_NODES, description=f"Instances (hosts) per run (at most {MAX_NODES}).")
    gpus: Optional[Count] = Field(
        None,
        ge=0,
        le=MAX_GPUS,
        description=f"GPUs per node the run uses (default: every GPU of the host; at most {MAX_GPUS}).",
    )
    procs_per_node: Optional[Count] = Field(
        None,
        ge=1,
        le=MAX_PROCS,
        description=f"Processes per node (default: gpus, or 1 without GPUs; at most {MAX_PROCS}).",
    )


class DataEntry(Strict):
    """A data set staged to each host before its runs start (README: Data)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    source: str = Field(
        ..., alias="from", min_length=1, description="s3://bucket/prefix/, or (local backend) a folder."
    )
    to: str = Field(
        ..., min_length=1, description="Folder on the host (~ allowed); relative: under orch's data folder."
    )


class TargetSection(Strict):
    """When a run is good enough (README: Time and dollars to a target)."""

    metric: str = Field(..., min_length=1, description="A key of the run's metrics lines, e.g. test_acc.")
    value: Amount = Field(..., description="The value to reach, e.g. 0.94.")
    mode: Optional[Literal["max", "min"]] = Field(
        None, description="max: reached at >= value; min: at <= value. Default: max for *acc, min for *loss."
    )

    def resolved_mode(self) -> str:
        return self.mode or default_mode(self.metric) or "max"

    def met(self, line: Dict[str, Any]) -> bool:
        v = finite(line.get(self.metric))
        if v is None:
            return False
        return v >= self.value if self.resolved_mode() == "max" else v <= self.value


class PruneSection(Strict):
    """Asynchronous successive halving across the sweep (README: Pruning losing runs)."""

    metric: Optional[str] = Field(
        None, min_length=1, description="The metric compared at each rung (default: target's metric)."
    )
    mode: Optional[Literal["max", "min"]] = Field(
        None, description="max or min (default: from target, or the metric's name)."
    )
    at: str = Field(
        "epoch", min_length=1, description="The metrics key that measures progress (a rung is a value of it)."
    )
    rungs: List[Annotated[Amount, Field(gt=0)]] = Field(
        ..., min_length=1, description="Progress values where runs are compared, increasing (each above 0)."
    )
    keep: Amount = Field(0.34, gt=0, lt=1, description="The fraction of runs kept at each rung (the best ones).")
    min_runs: Count = Field(3, ge=1, description="No decision at a rung before this many runs have reported there.")


class SweepSpec(Strict):
    """One sweep: a command run once per point of `grid` x `seeds`."""

    name: str = Field(
        ..., pattern=NAME_RE, description="Sweep name: letters, digits, '-' and '_'; names the store folder."
    )
    description: str = Field("", description="Free text, shown by `orch status`.")
    backend: Literal["local", "aws"] = Field("local", description="Where runs execute: local or aws.")
    command: str = Field(
        DEFAULT_COMMAND,
        min_length=1,
        description="Shell command of one run; {name} placeholders take params, grid values and builtins.",
    )
    params: Dict[str, Scalar] = Field(default_factory=dict, description="Fixed values shared by every run.")
    grid: Dict[str, List[Scalar]] = Field(
        default_factory=dict, description="Lists of values; the sweep runs their cartesian product."
    )
    seeds: Union[StrictInt, List[StrictInt]] = Field(
        1, description="A count N (seeds 0..N-1) or an explicit list of seeds; each point runs once per seed."
    )
    max_parallel: Count = Field(2, ge=1, description="How many runs execute at the same time.")
    max_restarts: Count = Field(1, ge=0, description="Restarts of a run whose command fails (preemptions are free).")
    timeout_minutes: Optional[Amount] = Field(
        None, gt=0, description="A run still going after this is stopped and failed."
    )
    budget_usd: Optional[Amount] = Field(
        None, gt=0, description="aws: once the realized cost reaches this, no new run or attempt starts."
    )
    store: str = Field(
        "",
        description=(
            "Where results go: a folder (relative to this file) or s3://bucket/prefix. Default $ORCH_HOME/store."
        ),
    )
    env: Dict[str, str] = Field(default_factory=dict, description="Extra environment variables for every run.")
    max_runs: Count = Field(
        MAX_RUNS,
        ge=1,
        le=MAX_RUNS_CEILING,
        description=(
            f"Refuse the sweep when grid x seeds expands to more runs than this (a guard against typos); at most "
            f"{MAX_RUNS_CEILING:,}."
        ),
    )
    data: Optional[List[DataEntry]] = Field(
        None, description="Data sets staged to each host before the command starts."
    )
    resources: Optional[ResourcesSection] = Field(
        None, description="The shape of each run: nodes, GPUs, processes per node."
    )
    target: Optional[TargetSection] = Field(
        None, description="When a run is good enough: collect reports time and dollars to it."
    )
    prune: Optional[PruneSection] = Field(
        None, description="Successive halving: stop runs that fall behind at each rung."
    )
    search: Optional[SearchSection] = Field(
        None, description="Random or Bayesian search instead of a grid: trials a sampler proposes."
    )
    local: LocalSection = Field(default_factory=LocalSection, description="Local backend settings.")
    aws: Optional[AwsSection] = Field(None, description="AWS backend settings (required with backend: aws).")


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep, fully resolved."""

    run_id: str  # readable and stable: grid values (and seed) joined, e.g. "lr=0.1,seed=0"
    params: Dict[str, Any]  # params + this point's grid values + seed
    command: str  # the shell command with placeholders substituted


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep: the validated spec, where it came from, and its runs."""

    spec: SweepSpec
    path: Path  # the sweep file
    store_url: str  # resolved: absolute folder or s3:// URL
    runs: List[RunSpec] = field(default_factory=list)

    def resolved(self) -> Dict[str, Any]:
        """What is recorded as sweep.json; a relaunch must match it."""
        # where the controller runs is no part of what the runs do: a relaunch may change it
        data = self.spec.model_dump(mode="json", exclude={"aws": {"controller"}})
        data["store"] = self.store_url
        data["runs"] = [r.run_id for r in self.runs]
        data["grid_order"] = list(
            self.spec.grid
        )  # records are written with sorted keys; run ids follow the file's order
        if self.spec.search is not None:  # likewise the space's order (the order trials show their params in)
            data["space_order"] = list(self.spec.search.space)
        return data


# --- loading ----------------------------------------------------------------------------------


def host_python(spec: SweepSpec) -> Optional[str]:
    """The interpreter `{python}` means: the instance's on aws, this one's locally."""
    return spec.aws.python if spec.backend == "aws" and spec.aws else None


def orch_home() -> Path:
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".orch")


def resolve_store(store: str, base: Path) -> str:
    if store.startswith("s3://"):
        return store.rstrip("/")
    if not store:
        return str(orch_home() / "store")
    p = Path(os.path.expanduser(store))
    return str((p if p.is_absolute() else base / p).resolve())


def seeds_of(spec: SweepSpec) -> List[int]:
    return list(range(spec.seeds)) if isinstance(spec.seeds, int) else list(spec.seeds)


def placeholders(command: str) -> List[str]:
    """Field names used in a command template; raises ValueError on malformed braces."""
    names = []
    for _, name, spec, conversion in string.Formatter().parse(command):
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError("positional placeholder '{}' is not allowed: name a param, e.g. {lr}")
        # Only plain {name}: a conversion, format spec, attribute or index would bypass the shell
        # quoting every value gets ({v!r} of "$(touch x)" is unquoted text) or crash at expansion.
        if conversion is not None or spec or not KEY_RE.match(name):
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            plain = re.split(r"[^A-Za-z0-9_]", name)[0] or "name"
            raise ValueError(
                f"placeholder {shown} is not allowed: only plain {{name}} placeholders are (no !conversion, "
                f":format, .attribute or [index]); write {{{plain}}}"
            )
        names.append(name)
    return names


# --- expansion --------------------------------------------------------------------------------


ID_VALUE_MAX = 48  # longer values are shortened in run ids, with a hash of the whole value so ids stay distinct


def run_count(spec: SweepSpec) -> int:
    """How many runs the spec expands to, computed without expanding it."""
    n = spec.seeds if isinstance(spec.seeds, int) else len(spec.seeds)
    if spec.search is not None:
        return n * spec.search.trials
    for values in spec.grid.values():
        n *= len(values)
    return n


def _id_value(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", text)
    if len(safe) <= ID_VALUE_MAX:
        return safe
    import hashlib

    return f"{safe[: ID_VALUE_MAX - 9]}~{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _shell_value(value: Any) -> str:
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return shlex.quote(value)
    return str(value)


def expand(spec: SweepSpec, python: Optional[str] = None) -> List[RunSpec]:
    """grid x seeds -> runs, in a deterministic order with stable, readable ids.

    A search's runs are its trials (x seeds); their commands are bound when the sampler has chosen
    their params (`bind`), just before their first start."""
    seeds = seeds_of(spec)
    if spec.search is not None:
        several = len(seeds) > 1
        return [
            RunSpec(run_id=trial_id(n, seed if several else None), params={**spec.params, "seed": seed}, command="")
            for n in range(spec.search.trials)
            for seed in seeds
        ]
    axes = list(spec.grid.items())
    runs = []
    for point in itertools.product(*(values for _, values in axes)):
        for seed in seeds:
            chosen = dict(zip((k for k, _ in axes), point))
            parts = [f"{k}={_id_value(v)}" for k, v in chosen.items()]
            if len(seeds) > 1:
                parts.append(f"seed={seed}")
            run_id = ",".join(parts) or "run"
            params = {**spec.params, **chosen, "seed": seed}
            runs.append(RunSpec(run_id=run_id, params=params, command=command_of(spec, run_id, params, python)))
    return runs


def command_of(spec: SweepSpec, run_id: str, params: Dict[str, Any], python: Optional[str]) -> str:
    """The run's shell command: every placeholder filled, every value shell-quoted data."""
    from orchestrator.sweep.shapes import torchrun_text

    values = {k: _shell_value(v) for k, v in params.items()}
    # "auto": the interpreter is found on the first host; the run reads it from $ORCH_PYTHON
    py = '"$ORCH_PYTHON"' if python == AUTO_PYTHON else shlex.quote(python or sys.executable)
    values.update(python=py, sweep=spec.name, run_id=shlex.quote(run_id), torchrun=torchrun_text(py))
    return spec.command.format(**values)


def bind(spec: SweepSpec, run: RunSpec, chosen: Dict[str, Any]) -> RunSpec:
    """A trial's run with the values its sampler chose: params and command."""
    params = {**run.params, **chosen}
    return RunSpec(run_id=run.run_id, params=params, command=command_of(spec, run.run_id, params, host_python(spec)))
