"""The `ssh:` section of sweep.yaml (`backend: ssh`: machines the user already has) and its rules for a sweep."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from pydantic import Field, field_validator

from orchestrator.remote.ssh_names import HOST_RE
from orchestrator.sweep.sections import Problems
from orchestrator.sweep.spec_types import Amount, Count, Strict


class HostEntry(Strict):
    """One machine, with what orch cannot or should not guess about it."""

    host: str = Field(description="`[user@]host[:port]`, as you would give it to ssh (no ~/.ssh/config aliases).")
    gpus: Count | None = Field(
        None, ge=0, description="GPUs orch may use there (default: what `nvidia-smi -L` lists, 0 without it)."
    )
    python: str | None = Field(
        None, description="Its Python 3.10+ for the agent and `{python}` (default: `ssh.python`)."
    )
    runs: Count | None = Field(
        None,
        ge=1,
        description="Runs at once there when they ask for no GPU (default 1; with GPUs: its GPUs / `gpus:`).",
    )


class SshSection(Strict):
    """Settings of the ssh backend (`backend: ssh`): machines you already have, reached over SSH."""

    hosts: list[Union[str, HostEntry]] = Field(  # noqa: UP007 - pydantic reads the union at run time
        description="The machines: `[user@]host[:port]` each, or a mapping with `host:` and `gpus:`/`python:`/`runs:`.",
        min_length=1,
    )
    key: str | None = Field(
        None, description="Private key file to log in with (default: the SSH agent, then ~/.ssh/id_*, as ssh does)."
    )
    known_hosts: str = Field(
        "~/.ssh/known_hosts",
        description="Where the hosts' keys are checked; a host not there, or with another key, is refused.",
    )
    user: str | None = Field(None, description="Login user for hosts that name none (default: yours here).")
    python: str = Field("python3", description="The hosts' Python 3.10+ (per host: `python:` in its mapping).")
    price_per_hour: Amount | None = Field(
        None, ge=0, description="Dollars per host-hour, if you pay for them: `orch collect` then counts dollars."
    )

    @field_validator("hosts")
    @classmethod
    def _spelled(cls, hosts: list) -> list:
        for h in hosts:
            name = h if isinstance(h, str) else h.host
            if not HOST_RE.match(name):
                raise ValueError(f"{name!r} is not `[user@]host[:port]` (e.g. alice@gpu1.lab:2222)")
        return hosts


@dataclass(frozen=True)
class HostSpec:
    """A host as the backend uses it: its label (as written, and the run records' `host`), and how to reach it."""

    label: str
    user: str
    address: str
    port: int
    gpus: int | None
    python: str
    runs: int | None


def host_specs(section: SshSection) -> list[HostSpec]:
    out = []
    for h in section.hosts:
        entry = HostEntry(host=h, gpus=None, python=None, runs=None) if isinstance(h, str) else h
        m = HOST_RE.match(entry.host)
        assert m is not None  # validated
        user = m["user"] or section.user or getpass.getuser()
        out.append(
            HostSpec(
                entry.host,
                user,
                m["host"].strip("[]"),
                int(m["port"] or 22),
                entry.gpus,
                entry.python or section.python,
                entry.runs,
            )
        )
    return out


def check(spec: Any, base: Path) -> Problems:
    """Hosts named once each, their key and known_hosts files here, shapes the hosts can hold."""
    section = spec.section("ssh")
    out: Problems = []
    if section is None:
        return [
            (("ssh",), "`backend: ssh` needs an `ssh:` section with `hosts:` (e.g. hosts: [alice@gpu1, gpu2:2222])")
        ]
    seen: dict[tuple, int] = {}
    for i, h in enumerate(host_specs(section)):
        where = (h.user, h.address, h.port)
        if where in seen:
            out.append((("ssh", "hosts", i), f"{h.label!r} is the same machine as hosts[{seen[where]}]; name it once"))
        seen.setdefault(where, i)
    if section.key is not None and not os.path.isfile(os.path.expanduser(section.key)):
        out.append((("ssh", "key"), f"{section.key}: no such file. Name your private key, or leave `key:` out"))
    known = os.path.expanduser(section.known_hosts)
    if not os.path.isfile(known):
        out.append(
            (
                ("ssh", "known_hosts"),
                f"{section.known_hosts}: no such file: orch checks every host's key against it. Log in to each host "
                "once with ssh (it asks you to check the key and keeps it there), or name your file",
            )
        )
    if spec.budget_usd is not None and section.price_per_hour is None:
        out.append(
            (
                ("budget_usd",),
                "on your own machines orch counts dollars only at the price you give: set `ssh.price_per_hour` "
                "(dollars per host-hour), or leave `budget_usd:` out",
            )
        )
    r = spec.resources
    if r is not None and r.nodes > len(section.hosts):
        out.append(
            (
                ("resources", "nodes"),
                f"a run of {r.nodes} nodes needs {r.nodes} hosts at once (one node each); `ssh.hosts` names "
                f"{len(section.hosts)}. Name more hosts, or lower `nodes:`",
            )
        )
    for i, entry in enumerate(spec.data or []):
        if entry.source.startswith("s3://"):
            out.append(
                (
                    ("data", i, "from"),
                    "ssh hosts get no AWS credentials from orch, so they cannot stage from S3; give a folder on the "
                    "hosts, or copy the data there",
                )
            )
    return out
