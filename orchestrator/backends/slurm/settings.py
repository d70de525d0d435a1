"""The `slurm:` section of sweep.yaml (`backend: slurm`: a cluster's scheduler) and its rules for a sweep."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from orchestrator.remote.ssh_names import HOST_RE
from orchestrator.sweep.sections import Problems
from orchestrator.sweep.spec_types import Amount, Count, Strict

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")  # a partition, account or QOS as Slurm names them
# Slurm's time formats (sbatch --time): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
TIME_RE = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
# sbatch options orch sets itself (or that would make a run's job something else): refused in `slurm.sbatch`, with
# the field that says it where there is one
OWN_OPTIONS = {
    "-J": "orch names each job after its run",
    "--job-name": "orch names each job after its run",
    "-o": "the job's output goes to the run's folder",
    "--output": "the job's output goes to the run's folder",
    "-e": "the job's output goes to the run's folder",
    "--error": "the job's output goes to the run's folder",
    "--signal": "orch asks for its warning before the time limit (`slurm.warn_s`)",
    "--requeue": "orch submits its jobs requeueable",
    "--no-requeue": "orch submits its jobs requeueable",
    "--parsable": "orch reads sbatch's answer itself",
    "--wrap": "orch writes each job's script",
    "-a": "each run is one job",
    "--array": "each run is one job",
    "-N": "use `resources.nodes`",
    "--nodes": "use `resources.nodes`",
    "-p": "use `slurm.partition`",
    "--partition": "use `slurm.partition`",
    "-A": "use `slurm.account`",
    "--account": "use `slurm.account`",
    "-q": "use `slurm.qos`",
    "--qos": "use `slurm.qos`",
    "-t": "use `slurm.time`",
    "--time": "use `slurm.time`",
    "-G": "use `resources.gpus`",
    "--gpus": "use `resources.gpus`",
    "--gres": "use `resources.gpus`",
    "-D": "orch runs each job in its run's folder",
    "--chdir": "orch runs each job in its run's folder",
    "--test-only": "orch submits the job",
    "-W": "orch watches the job",
    "--wait": "orch watches the job",
}


def time_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds; None when it is not one of Slurm's formats."""
    m = TIME_RE.match(text.strip())
    if m is None:
        return None
    if m["d"] is not None:
        return int(m["d"]) * 86400 + int(m["dh"]) * 3600 + int(m["dm"] or 0) * 60 + int(m["ds"] or 0)
    parts = [int(p) for p in (m["a"], m["b"], m["c"]) if p is not None]
    if len(parts) == 3:
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0)


class SlurmSection(Strict):
    """Settings of the slurm backend (`backend: slurm`): each run one job of your cluster's Slurm."""

    login: str | None = Field(
        None,
        description="`[user@]host[:port]` of a login node, reached over SSH (its key checked against `known_hosts`); "
        "left out: Slurm's commands on this machine.",
    )
    key: str | None = Field(None, description="Private key for the login node (default: the SSH agent, ~/.ssh/id_*).")
    known_hosts: str = Field("~/.ssh/known_hosts", description="Where the login node's key is checked.")
    partition: str | None = Field(None, description="The partition (`sbatch --partition`; default: the cluster's).")
    account: str | None = Field(None, description="The account charged (`sbatch --account`).")
    qos: str | None = Field(None, description="The quality of service (`sbatch --qos`).")
    time: str | None = Field(
        None,
        description="Each job's time limit, in Slurm's format (`90`, `4:00:00`, `1-12:00:00`); a run longer than it "
        "goes on in a new job from its newest checkpoint. Default: the partition's.",
    )
    warn_s: Count = Field(
        180,
        ge=10,
        le=65535,  # sbatch's limit
        description="Seconds before the time limit at which a job is told to checkpoint and end (Slurm may tell it up "
        "to 60 s early).",
    )
    sbatch: list[str] = Field(
        default_factory=list,
        description="More sbatch options, one per item (`--constraint=a100`, `--mem=32G`); passed as they are, never "
        "through a shell.",
    )
    workdir: str = Field(
        "~/orch/slurm",
        description="Where the runs' folders are, on a filesystem the nodes and the login node share (a home).",
    )
    python: str = Field("python3", description="The nodes' Python 3.10+ for the agent and `{python}`.")
    price_per_gpu_hour: Amount | None = Field(
        None, ge=0, description="Dollars per GPU-hour, if you are charged: `orch collect` then counts dollars."
    )

    @field_validator("login")
    @classmethod
    def _login(cls, login: str | None) -> str | None:
        if login is not None and not HOST_RE.match(login):
            raise ValueError(f"{login!r} is not `[user@]host[:port]` (e.g. alice@login.cluster.edu)")
        return login

    @field_validator("partition", "account", "qos")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        if name is not None and not NAME_RE.match(name):
            raise ValueError(f"{name!r} is not a Slurm name (letters, digits, `_.+-`)")
        return name

    @field_validator("time")
    @classmethod
    def _time(cls, text: str | None) -> str | None:
        if text is not None and not time_seconds(text):
            raise ValueError(
                f"{text!r} is not a Slurm time limit: write minutes (`90`), `H:MM:SS` (`4:00:00`) or `D-HH:MM:SS` "
                "(`1-12:00:00`)"
            )
        return text

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, options: list[str]) -> list[str]:
        for opt in options:
            if not opt.startswith("-"):
                raise ValueError(f"{opt!r} is not an sbatch option: write each as `--name=value`")
            name = opt.split("=", 1)[0]
            name = name if name.startswith("--") else name[:2]
            if name in OWN_OPTIONS:
                raise ValueError(f"{opt!r}: {OWN_OPTIONS[name]}; leave it out of `slurm.sbatch`")
        return options


def check(spec: Any, base: Path) -> Problems:
    """What a sweep on Slurm needs of its other fields."""
    section = spec.section("slurm") or SlurmSection.model_validate({})
    out: Problems = []
    if section.key is not None and not os.path.isfile(os.path.expanduser(section.key)):
        out.append((("slurm", "key"), f"{section.key}: no such file. Name your private key, or leave `key:` out"))
    if section.login is not None and not os.path.isfile(os.path.expanduser(section.known_hosts)):
        out.append(
            (
                ("slurm", "known_hosts"),
                f"{section.known_hosts}: no such file: orch checks the login node's key against it. Log in once with "
                "ssh (it asks you to check the key and keeps it there), or name your file",
            )
        )
    if spec.budget_usd is not None and section.price_per_gpu_hour is None:
        out.append(
            (
                ("budget_usd",),
                "on a cluster orch counts dollars only at the price you give: set `slurm.price_per_gpu_hour`, or "
                "leave `budget_usd:` out",
            )
        )
    limit = time_seconds(section.time) if section.time else None
    if limit is not None and limit <= section.warn_s + 60:
        out.append(
            (
                ("slurm", "time"),
                f"a job of {section.time} would be told to checkpoint {section.warn_s} s before its end, right after "
                "it starts: give each job longer, or lower `slurm.warn_s`",
            )
        )
    return out


def gpus_of(spec: Any) -> int:
    r = spec.resources
    gpus = r.gpus if r is not None else None
    return gpus if isinstance(gpus, int) else 0


__all__ = ["Count", "SlurmSection", "check", "gpus_of", "time_seconds"]
