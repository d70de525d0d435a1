"""The shape of a run: how many nodes, GPUs and processes it takes (`resources:`), the `{torchrun}`
placeholder, and the ORCH_* variables that say where a process stands in that shape.

`{torchrun}` expands to text the host's shell completes: the run's interpreter with
`-m torch.distributed.run` and the node count, processes per node, node rank and rendezvous
address from the environment the agent gives every attempt (ORCH_NODES, ORCH_PROCS_PER_NODE,
ORCH_NODE_RANK, ORCH_MASTER_ADDR, ORCH_MASTER_PORT). Processes per node default to the GPUs the
run uses, which default to every GPU of the host (found by the agent), or 1 process on a host
without GPUs.
"""

from __future__ import annotations

from typing import Any

from orchestrator.contract import AUTO

TORCHRUN = (
    '{python} -m torch.distributed.run --nnodes "$ORCH_NODES" --nproc-per-node "$ORCH_PROCS_PER_NODE" '
    '--node-rank "$ORCH_NODE_RANK" --master-addr "$ORCH_MASTER_ADDR" --master-port "$ORCH_MASTER_PORT" --rdzv-id '
    '"$ORCH_RDZV_ID"'
)


def torchrun_text(python: str) -> str:
    return TORCHRUN.format(python=python)


def shape_env(resources: Any) -> dict[str, str]:
    """The shape's part of the run contract, as the backend knows it (the agent completes `auto`)."""
    nodes = resources.nodes if resources else 1
    gpus = resources.gpus if resources and resources.gpus is not None else None
    procs = resources.procs_per_node if resources and resources.procs_per_node is not None else None
    if procs is None and gpus is not None:
        procs = max(1, gpus)
    env = {
        "ORCH_NODES": str(nodes),
        "ORCH_NODE_RANK": "0",
        "ORCH_MASTER_ADDR": "127.0.0.1",
        "ORCH_PROCS_PER_NODE": str(procs) if procs is not None else AUTO,
        "ORCH_GPUS": str(gpus) if gpus is not None else AUTO,
    }
    return env


def describe(resources: Any, gpus_of_type: int | None = None) -> str:
    """The shape in words, for --dry-run."""
    env = shape_env(resources)
    gpus = int(env["ORCH_GPUS"]) if env["ORCH_GPUS"] != AUTO else gpus_of_type
    procs = (
        int(env["ORCH_PROCS_PER_NODE"])
        if env["ORCH_PROCS_PER_NODE"] != AUTO
        else (max(1, gpus) if gpus is not None else None)
    )
    g = f"{gpus} GPU(s)" if gpus is not None else "every GPU of the host"
    p = f"{procs} process(es)" if procs is not None else "one process per GPU (1 without GPUs)"
    return f"{env['ORCH_NODES']} node(s); per node {g}, {p}"
