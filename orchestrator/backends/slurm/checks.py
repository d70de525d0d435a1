"""What `orch launch` asks of the cluster before it submits anything (and `--dry-run` shows): Slurm's version, the
job's options as Slurm itself judges them (`sbatch --test-only`, so an unknown partition is refused in Slurm's words at
the field's file:line), the runs' folder, and that the nodes can reach a folder store."""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.slurm import script
from orchestrator.backends.slurm.commands import Slurm
from orchestrator.backends.slurm.settings import SlurmSection
from orchestrator.errors import OrchError
from orchestrator.remote.runners import Runner
from orchestrator.store.s3url import is_s3
from orchestrator.sweep.load import located
from orchestrator.sweep.spec import Sweep


@dataclass(frozen=True)
class Cluster:
    """What the checks need of the backend: the sweep, its section, Slurm, the shell, the runs' folder."""

    sweep: Sweep
    settings: SlurmSection
    slurm: Slurm
    shell: Runner
    gpus: int
    base: str


# Slurm's refusal -> the field of sweep.yaml that said it
FIELDS = (  # account first: "Invalid account or account/partition combination specified" is about the account
    ("account", ("slurm", "account")),
    ("partition", ("slurm", "partition")),
    ("qos", ("slurm", "qos")),
    ("time", ("slurm", "time")),
    ("gres", ("resources", "gpus")),
    ("gpu", ("resources", "gpus")),
)


def _field(verdict: str) -> tuple[str, str]:
    low = verdict.lower()
    return next((f for word, f in FIELDS if word in low), ("slurm", "sbatch"))


def _options(b: Cluster) -> list[str]:
    r = b.sweep.spec.resources
    return script.options(b.settings, "orch-check", b.gpus, "/dev/null", r.nodes if r is not None else 1)


def verdict(b: Cluster) -> str:
    return b.slurm.test_only(_options(b))


def preflight(b: Cluster) -> None:
    path = b.sweep.path
    b.slurm.version()
    said = verdict(b)
    if said:
        raise OrchError(
            f"{located(path, _field(said))}: Slurm refuses the job's options: {said}. Check the name with `sinfo` "
            "(partitions), `sacctmgr show assoc user=$USER` (accounts, QOS), or leave the field out",
            exit_code=2,
        )
    base = b.base
    if b.shell.run(f"mkdir -p {shlex.quote(base)} && test -w {shlex.quote(base)}", timeout=30).code != 0:
        raise OrchError(f"{located(path, ('slurm', 'workdir'))}: {base} cannot be made or written there", exit_code=2)
    if not is_s3(b.sweep.store_url) and b.settings.login is not None:
        _store_seen(b)


def _store_seen(b: Cluster) -> None:
    """A folder store must be the cluster's too: a file written here must read the same on the login node."""
    folder = Path(b.sweep.store_url)
    folder.mkdir(parents=True, exist_ok=True)
    nonce = secrets.token_hex(8)
    probe = folder / f".orch-probe-{nonce}"
    probe.write_text(nonce)
    try:
        seen = b.shell.run(f"cat {shlex.quote(str(probe))}", timeout=30).out.strip()
    finally:
        probe.unlink(missing_ok=True)
    if seen != nonce:
        raise OrchError(
            f"the store {folder} is a folder of this machine that the login node {b.settings.login} does not see, so "
            "the cluster's nodes cannot write to it. Use a folder on the cluster's shared filesystem that this machine "
            "mounts at the same path, or an s3:// store (`store:`)",
            exit_code=2,
        )


def plan(b: Cluster) -> dict:
    s = b.settings
    return {
        "version": ".".join(str(v) for v in b.slurm.version()),
        "login": s.login,
        "partition": s.partition,
        "account": s.account,
        "qos": s.qos,
        "time": s.time,
        "warn_s": s.warn_s,
        "gpus": b.gpus,
        "jobs": b.sweep.spec.max_parallel,
        "price": s.price_per_gpu_hour,
        "verdict": verdict(b),
        "sbatch": _options(b)[3:],
        "nodes": b.sweep.spec.resources.nodes if b.sweep.spec.resources else 1,
    }
