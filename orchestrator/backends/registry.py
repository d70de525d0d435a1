"""The registry of backends: one line per backend, and the one place a backend's name is looked up.

Each entry declares what the layers above and below need of its backend, so that `sweep/`, `control/`,
`contract.py` and the CLI's generic commands name none:

- `schema` (sweep/sections.py): its name (`backend: NAME`), the model of its section of sweep.yaml (`NAME: {...}`),
  its cross-field checks, the interpreter `{python}` means on its hosts, whether it counts dollars. The sweep layer
  sits below this one and cannot import it, so the loader here hands the schemas down in pydantic's validation
  context; an unknown `backend:` is refused there, with file:line and the list of known ones.
- `make`: the backend (backends/base.py's interface) for a loaded sweep, imported only when asked for.
- `costs`: how its cost ledger (the store's cost.json) reads in dollars, for `orch status`, `collect`, the board and
  the target's economics; None for a backend that spends nothing orch can count.
- `explain`: its cloud's errors nobody turned into words yet (no credentials, say) as an OrchError, for the CLI;
  None for an error that is not its own.
- `host_ids`: the pattern of its hosts' ids, so that `orch attach ID` (or logs, chaos...) finds the run on that host.
- `plan_lines`: its `--dry-run` plan (`Backend.plan()`) in words: where, which choices at what price, the cost bound.
- `leftovers`: what it made that outlives a sweep's own teardown, found over the places (aws: regions) of the sweeps
  launched here, for `orch gc` and `orch down --all` (and `orch down NAME` of a name it makes that is no sweep's).

Host-side parts (spot notices from the metadata service, self-termination, rung tags) are switched on by name in
the tasks a backend builds (`RunTask.host_parts`, one of `contract.HOST_PARTS`); the agent (host/; the aws backend's
parts in host/aws/) has them all.
Adding a backend: docs/backends.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.backends.aws import checks as aws_checks
from orchestrator.backends.aws.settings import AwsSection
from orchestrator.backends.base import Backend
from orchestrator.backends.local.settings import LocalSection
from orchestrator.backends.local.settings import check as local_checks
from orchestrator.backends.slurm import settings as slurm_settings
from orchestrator.backends.ssh import settings as ssh_settings
from orchestrator.errors import OrchError
from orchestrator.sweep import load
from orchestrator.sweep.sections import BackendSchema
from orchestrator.sweep.spec import Sweep


@dataclass(frozen=True)
class Costs:
    """Dollars out of a backend's cost ledger (one entry per instance: type, market, price, start, end, run...)."""

    total: Callable[[dict[str, dict]], float]  # the whole sweep
    per_run: Callable[[dict[str, dict]], dict[str, tuple[float, float]]]  # run -> (dollars, GPU-hours)
    controller: Callable[[dict[str, dict]], float]  # the remote controller's part of total
    on_demand: Callable[..., float | None]  # an on-demand hour of a type (given its spot price, and its region)
    # run -> {attempt: where it ran} (aws: the region), for `orch status` and `orch collect`
    places: Callable[[dict[str, dict]], dict[str, dict[int, str]]]
    # (dollars, bytes) of a run's data moved across regions, from its record's `moved` (attempt -> [up, down])
    transfer: Callable[[dict[str, dict], str, dict[str, list[int]]], tuple[float, int]]
    # (ledger, the measured attempts of rates.json) -> the work bought per type and what the hour alone would have cost
    work: Callable[[dict[str, dict], dict[str, dict]], dict] | None = None
    whys: Callable[[dict[str, dict]], dict[str, dict[int, str]]] | None = None  # run -> {attempt: where and why}


@dataclass(frozen=True)
class Leftovers:
    """What a backend made and still exists, by place (aws: region) and sweep; `orch gc` lists it, `orch down --all`
    removes what no sweep known here owns."""

    # (the sweeps on it launched here, problems) -> {place: {sweep: [resource, ...]}}. A place that cannot be searched
    # raises an OrchError, or with `problems` given adds a line saying why to it and is left out.
    scan: Callable[[list[Sweep], list[str] | None], dict[str, dict[str, list[str]]]]
    remove: Callable[[str, str], list[str]]  # (place, sweep) -> what went
    names: str | None = None  # a pattern of names it gives what is no sweep's (aws: `ami-RECIPE`, an image build)


@dataclass(frozen=True)
class Entry:
    schema: BackendSchema
    make: Callable[[Sweep], Backend]
    costs: Callable[[], Costs] | None = None  # called when needed: pricing imports stay out of `orch --help`
    explain: Callable[[BaseException], OrchError | None] | None = None
    host_ids: str | None = None  # a regular expression a whole host id matches
    plan_lines: Callable[[Sweep, dict], list[str]] | None = None  # its plan in words (`orch launch --dry-run`)
    leftovers: Callable[[], Leftovers] | None = None  # called when needed, as `costs`

    @property
    def name(self) -> str:
        return self.schema.name


def _local(sweep: Sweep) -> Backend:
    from orchestrator.backends.local.backend import LocalBackend

    return LocalBackend(sweep)


def _aws(sweep: Sweep) -> Backend:
    from orchestrator.backends.aws.backend import AwsBackend

    return AwsBackend(sweep)


def _ssh(sweep: Sweep) -> Backend:
    from orchestrator.backends.ssh.backend import SshBackend

    return SshBackend(sweep)


def _ssh_python(spec: Any) -> str | None:
    ssh = spec.section("ssh")
    return ssh.python if ssh is not None else None


def _ssh_costs() -> Costs:
    from orchestrator.backends.ssh import ledger

    return Costs(ledger.total, ledger.per_run, lambda _: 0.0, lambda *_a, **_k: None, ledger.places, _no_transfer)


def _ssh_plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    from orchestrator.backends.ssh.dry_run import plan_lines

    return plan_lines(sweep, plan)


def _ssh_leftovers() -> Leftovers:
    from orchestrator.backends.ssh import leftovers

    return Leftovers(leftovers.scan, leftovers.remove, leftovers.NAMES)


def _slurm(sweep: Sweep) -> Backend:
    from orchestrator.backends.slurm.backend import SlurmBackend

    return SlurmBackend(sweep)


def _slurm_python(spec: Any) -> str | None:
    section = spec.section("slurm")
    return section.python if section is not None else "python3"


def _slurm_costs() -> Costs:
    from orchestrator.backends.slurm import ledger

    return Costs(
        ledger.total,
        ledger.per_run,
        lambda _: 0.0,
        lambda *_a, **_k: None,
        ledger.places,
        _no_transfer,
        whys=ledger.whys,
    )


def _slurm_plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    from orchestrator.backends.slurm.dry_run import plan_lines

    return plan_lines(sweep, plan)


def _no_transfer(ledger: dict, run: str, moved: dict) -> tuple[float, int]:
    return 0.0, 0


def _aws_costs() -> Costs:
    from orchestrator.backends.aws.cloud import pricing, worth

    return Costs(
        pricing.ledger_cost,
        pricing.per_run,
        pricing.controller_cost,
        pricing.on_demand_price,
        pricing.attempt_regions,
        pricing.transfer_usd,
        worth.realized,
        pricing.attempt_whys,
    )


def _aws_compared(section: dict) -> dict:
    """`aws.ssh.identity` as the absolute path it names here: `~/.ssh/x` and `/home/me/.ssh/x` are one key."""
    ssh = section.get("ssh")
    if not isinstance(ssh, dict) or not isinstance(ssh.get("identity"), str):
        return section
    return {**section, "ssh": {**ssh, "identity": os.path.abspath(os.path.expanduser(ssh["identity"]))}}


def _aws_explain(exc: BaseException) -> OrchError | None:
    if not type(exc).__module__.startswith("botocore"):
        return None
    from orchestrator.backends.aws.cloud.ec2 import explain

    return explain(exc, "an AWS call")


def _aws_plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    from orchestrator.backends.aws.dry_run import plan_lines

    return plan_lines(sweep, plan)


def _aws_leftovers() -> Leftovers:
    from orchestrator.backends.aws import leftovers

    return Leftovers(leftovers.scan, leftovers.remove, leftovers.NAMES)


def _aws_python(spec: Any) -> str | None:
    aws = spec.section("aws")
    return aws.python if aws is not None else None


BACKENDS: tuple[Entry, ...] = (
    Entry(BackendSchema("local", LocalSection, checks=local_checks, host_path=os.path.expanduser), _local),
    Entry(
        BackendSchema(
            "aws",
            AwsSection,
            aws_checks.check,
            _aws_python,
            counts_dollars=True,
            buys_markets=True,
            unrecorded=("controller", "switch_s"),
            compared=_aws_compared,
        ),
        _aws,
        _aws_costs,
        _aws_explain,
        r"i-[0-9a-f]{8,17}",  # an EC2 instance id, as users of the seed tooling type it
        _aws_plan_lines,
        _aws_leftovers,
    ),
    Entry(
        BackendSchema("ssh", ssh_settings.SshSection, ssh_settings.check, _ssh_python, counts_dollars=True),
        _ssh,
        _ssh_costs,
        plan_lines=_ssh_plan_lines,
        leftovers=_ssh_leftovers,
    ),
    Entry(
        BackendSchema("slurm", slurm_settings.SlurmSection, slurm_settings.check, _slurm_python, counts_dollars=True),
        _slurm,
        _slurm_costs,
        plan_lines=_slurm_plan_lines,
    ),
)


def schemas() -> dict[str, BackendSchema]:
    return {e.name: e.schema for e in BACKENDS}


def entry(name: str) -> Entry:
    for e in BACKENDS:
        if e.name == name:
            return e
    raise OrchError(f"unknown backend {name!r}; known backends: {', '.join(e.name for e in BACKENDS)}")


def explain(exc: BaseException) -> OrchError | None:
    """A backend's error in words (its entry's `explain`); None when no backend calls it its own."""
    for e in BACKENDS:
        err = e.explain(exc) if e.explain is not None else None
        if err is not None:
            return err
    return None


def backends_with_host(host_id: str) -> set[str]:
    """The names of the backends whose hosts have ids like `host_id`."""
    return {e.name for e in BACKENDS if e.host_ids is not None and re.fullmatch(e.host_ids, host_id)}


def with_leftovers() -> list[tuple[str, Leftovers]]:
    """(name, leftovers) of each backend that makes things outliving a sweep's teardown."""
    return [(e.name, e.leftovers()) for e in BACKENDS if e.leftovers is not None]


def backend_for(sweep: Sweep) -> Backend:
    """The backend a sweep runs on (`backend:` in its spec, validated against this registry when loaded)."""
    return entry(sweep.spec.backend).make(sweep)


def costs_of(sweep: Sweep) -> Costs | None:
    """How the sweep's cost ledger reads in dollars; None when its backend counts none."""
    make = entry(sweep.spec.backend).costs
    return make() if make is not None else None


def load_sweep(path: str | Path) -> Sweep:
    """Read, validate and expand a sweep file against the known backends (sweep/load.py)."""
    return load.load_sweep(path, schemas())


def sweep_from_record(record: dict[str, Any], path: str) -> Sweep:
    """Rebuild a Sweep from its record in the store against the known backends (sweep/load.py)."""
    return load.sweep_from_record(record, path, schemas())
