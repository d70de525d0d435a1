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

from typing import Any, Dict, List, Optional, Tuple

from orchestrator.contract import AUTO

LOCAL_PROCS_PER_CORE = 4  # locally, nodes x procs_per_node may not exceed this many per CPU core

# GPUs per instance type, for types an endpoint does not describe (DescribeInstanceTypes GpuInfo wins).
GPUS_OF_TYPE = {
    "g4dn.xlarge": 1,
    "g4dn.2xlarge": 1,
    "g4dn.4xlarge": 1,
    "g4dn.8xlarge": 1,
    "g4dn.12xlarge": 4,
    "g4dn.16xlarge": 1,
    "g4dn.metal": 8,
    "g5.xlarge": 1,
    "g5.2xlarge": 1,
    "g5.4xlarge": 1,
    "g5.8xlarge": 1,
    "g5.12xlarge": 4,
    "g5.16xlarge": 1,
    "g5.24xlarge": 4,
    "g5.48xlarge": 8,
    "g6.xlarge": 1,
    "g6.2xlarge": 1,
    "g6.4xlarge": 1,
    "g6.8xlarge": 1,
    "g6.12xlarge": 4,
    "g6.16xlarge": 1,
    "g6.24xlarge": 4,
    "g6.48xlarge": 8,
    "g6e.xlarge": 1,
    "g6e.2xlarge": 1,
    "g6e.4xlarge": 1,
    "g6e.8xlarge": 1,
    "g6e.12xlarge": 4,
    "g6e.16xlarge": 1,
    "g6e.24xlarge": 4,
    "g6e.48xlarge": 8,
    "p3.2xlarge": 1,
    "p3.8xlarge": 4,
    "p3.16xlarge": 8,
    "p3dn.24xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
}

TORCHRUN = (
    '{python} -m torch.distributed.run --nnodes "$ORCH_NODES" --nproc-per-node "$ORCH_PROCS_PER_NODE" '
    '--node-rank "$ORCH_NODE_RANK" --master-addr "$ORCH_MASTER_ADDR" --master-port "$ORCH_MASTER_PORT" --rdzv-id '
    '"$ORCH_RDZV_ID"'
)


def torchrun_text(python: str) -> str:
    return TORCHRUN.format(python=python)


def shape_env(resources: Any) -> Dict[str, str]:
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


def check(spec: Any) -> List[Tuple[Tuple[Any, ...], str]]:
    """Shapes that cannot run, each (location, message with the fix)."""
    out: List[Tuple[Tuple[Any, ...], str]] = []
    r = spec.resources
    if r is None:
        return out
    if spec.backend == "aws" and spec.aws is not None and r.gpus:
        known = [GPUS_OF_TYPE[t] for t in spec.aws.instance_types if t in GPUS_OF_TYPE]
        if known and len(known) == len(spec.aws.instance_types) and r.gpus > max(known):
            out.append(
                (
                    ("resources", "gpus"),
                    f"{r.gpus} GPUs per node, but the most any of {', '.join(spec.aws.instance_types)} "
                    f"has is {max(known)}; lower `gpus:` or list a larger type (e.g. p4d.24xlarge: 8)",
                )
            )
    if spec.backend == "local":
        import os

        cores = os.cpu_count() or 1
        procs = r.nodes * (r.procs_per_node or max(1, r.gpus or 1))
        if procs > cores * LOCAL_PROCS_PER_CORE:
            where = ("resources", "nodes") if r.nodes > 1 else ("resources", "procs_per_node")
            out.append(
                (
                    where,
                    f"{r.nodes} node(s) x {procs // r.nodes} process(es) = {procs} processes per run on this machine's "
                    f"{cores} CPU core(s); locally at most {cores * LOCAL_PROCS_PER_CORE} ({LOCAL_PROCS_PER_CORE} per "
                    "core). "
                    f"Lower `nodes:` / `procs_per_node:`",
                )
            )
    return out


def describe(resources: Any, gpus_of_type: Optional[int] = None) -> str:
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
