"""One attempt of a run as its host needs it: the task (RunTask), its ORCH_* environment and its data entries.

Built on the user's machine from the validated sweep (new_task), once; what only an acquired host decides (its
instance, node rank, interpreter, rendezvous, slot) makes a copy of it (on_host). The agent on the host reads only
the task.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.contract import RunTask, code_dir, ctl_dir, run_root, session_name

if TYPE_CHECKING:  # the agent imports this module on hosts; keep pydantic out of its start-up
    from orchestrator.sweep.spec import Sweep
import logging
import os
from pathlib import Path

log = logging.getLogger("orch.agent")


def run_env(sweep: Sweep, run_id: str, attempt: int, run_dir: str, params_json: str) -> dict[str, str]:
    """The ORCH_* environment of one attempt (docs/reference/run-contract.md), over the sweep's `env:`."""
    from orchestrator.sweep.shapes import shape_env

    env = dict(sweep.spec.env)
    env.update(
        ORCH_SWEEP=sweep.spec.name,
        ORCH_RUN_ID=run_id,
        ORCH_ATTEMPT=str(attempt),
        ORCH_RUN_DIR=run_dir,
        ORCH_PARAMS_JSON=params_json,
        PYTHONUNBUFFERED="1",
        ORCH_RDZV_ID=f"{sweep.spec.name}-{run_id}-{attempt}",
        **shape_env(sweep.spec.resources),
    )
    return env


def new_task(
    sweep: Sweep,
    run_id: str,
    attempt: int,
    command: str,
    params_json: str,
    base: str,
    env: dict[str, str] | None = None,
    **periods,
) -> RunTask:
    """The task of one attempt; `env` is laid under the contract's variables, `periods` are RunTask fields (with
    `replaces`: the host of a previous attempt that was preempted or lost)."""
    from orchestrator.sweep.tasks import resolve

    root = run_root(base, sweep.spec.name, run_id)
    minutes = sweep.spec.timeout_minutes
    data = resolve(sweep.spec.data, sweep.path.parent, f"{base.rstrip('/')}/.data")  # relative `to:`: beside the runs
    env = {**(env or {}), **({"ORCH_DATA_DIR": data[0]["to"]} if data else {})}
    code = sweep.code.get("digest", "")
    folder = code_dir(base, code) if code else ""
    if folder:
        env["ORCH_WORKDIR"] = folder
    prune = sweep.spec.prune
    if prune is not None:
        metric = prune.metric or (sweep.spec.target.metric if sweep.spec.target else "")
        periods = {"rungs_at": prune.at, "rungs": [float(r) for r in prune.rungs], "rungs_metric": metric, **periods}
    return RunTask(
        sweep=sweep.spec.name,
        run_id=run_id,
        attempt=attempt,
        command=command,
        store_url=sweep.store_url,
        run_dir=f"{root}/run",
        ctl_dir=ctl_dir(base, sweep.spec.name, run_id),
        session=session_name(sweep.spec.name, run_id),
        env={**(env or {}), **run_env(sweep, run_id, attempt, f"{root}/run", params_json)},
        timeout_s=minutes * 60 if minutes else None,
        data=data,
        code=code,
        code_sha256=sweep.code.get("archive_sha256", "") if code else "",
        code_dir=folder,
        setup=sweep.spec.setup if code else "",
        **periods,
    )


def on_host(
    task: RunTask, host: str, rank: int = 0, hosts: int = 1, env: dict[str, str] | None = None, slot: int = -1
) -> RunTask:
    """This attempt's task as one host runs it: node `rank` of the `hosts` it spans, on instance `host`, in `slot`
    of a shared instance; `env` (what the host decided: interpreter, rendezvous, GPUs) over the task's own."""
    env = {**task.env, **(env or {}), "ORCH_NODE_RANK": str(rank)}
    return replace(task, env=env, host=host, node_hosts=hosts, node_rank=rank, slot=slot)


def resolve(entries: list | None, source_base: Path, to_base: str) -> list[dict[str, str]]:
    """`data:` of a spec as the agent needs it: local sources absolute (relative to the sweep file),
    relative `to:` under `to_base` (the host's data folder)."""
    out = []
    for e in entries or []:
        src = e.source
        if not src.startswith("s3://"):
            p = Path(os.path.expanduser(src))
            src = str(p if p.is_absolute() else (source_base / p).resolve())
        to = e.to
        if not (to.startswith("/") or to.startswith("~")):
            to = f"{to_base.rstrip('/')}/{to}"
        out.append({"from": src, "to": to})
    return out
