"""The sweep's instances as the controller sees them: one Host per run on each (one for each node of a multi-node
attempt, ranked by instance id; one per slot of a shared instance), plus one ACQUIRING host for each attempt still
waiting for CreateFleet; and a run's instances found by its id.
"""

from __future__ import annotations

from orchestrator.backends.aws.adopt import orphan_deadline
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.backends.base import ACQUIRING, Host
from orchestrator.host.aws.slots import slot_run

ADOPTED_REPORT_S = 60.0  # the boot allowance's margin for an instance this controller did not provision


def hosts(
    state: ProvisioningState,
    instances: list[dict],
    pending: dict[str, int],
    ready: dict[str, tuple],
    start_timeout_s: float,
) -> list[Host]:
    """The Hosts of the sweep's listed (pending and running) instances and of the attempts being provisioned
    (`pending` and `ready`: ProvisioningState.in_flight() as of just after the listing)."""
    out = []
    ranks = {}  # (run, attempt) -> its instance ids in rank order
    for i in sorted(instances, key=lambda i: i["instance_id"]):
        ranks.setdefault((i["run"], i["attempt"]), []).append(i["instance_id"])
    for i in instances:
        if i["slot_count"]:  # a shared instance: one host per run on it
            out += _packed_hosts(state, i, pending, ready, start_timeout_s)
            continue
        if not i["run"]:
            continue
        attempt = int(i["attempt"]) if i["attempt"].isdigit() else None
        out.append(
            Host(
                run_id=i["run"],
                host_id=i["instance_id"],
                address=state.address(i),
                attempt=attempt,
                provisioning=pending.get(i["run"]) == attempt,
                start_deadline=_deadline(state, i, attempt, ready, start_timeout_s, pending.get(i["run"]) == attempt),
                node=ranks[(i["run"], i["attempt"])].index(i["instance_id"]),
                nodes=state.nodes,
                mark=None if i.get("rungs_left") is None else f"rungs left: {i['rungs_left']}",
            )
        )
    seen = {h.run_id for h in out}
    out += [
        Host(run_id=r, host_id=ACQUIRING, address="", attempt=a, provisioning=True, nodes=state.nodes)
        for r, a in pending.items()
        if r not in seen
    ]
    return out


def _packed_hosts(
    state: ProvisioningState, inst: dict, pending: dict[str, int], ready: dict[str, tuple], start_timeout_s: float
) -> list[Host]:
    """One Host per run on a packed instance (its slot tags)."""
    out = []
    for slot, value in sorted(inst["slots"].items()):
        run_id, att = slot_run(value), value.rpartition("#")[2]
        attempt = int(att) if att.isdigit() else None
        out.append(
            Host(
                run_id=run_id,
                host_id=inst["instance_id"],
                address=state.address(inst),
                attempt=attempt,
                provisioning=pending.get(run_id) == attempt,
                start_deadline=_deadline(
                    state, {**inst, "run": run_id}, attempt, ready, start_timeout_s, pending.get(run_id) == attempt
                ),
                slot=slot,
            )
        )
    return out


def _deadline(
    state: ProvisioningState,
    inst: dict,
    attempt: int | None,
    ready: dict[str, tuple],
    start_timeout_s: float,
    provisioning: bool,
) -> float | None:
    """When the agent on this instance must have reported: counted from when this controller
    started it; for an instance a controller that died bought, as adopt.py finds it; else (a hand-off:
    the controller before may still be provisioning it) from its launch plus the whole boot allowance."""
    started = ready.get(inst["run"])
    if started and started[0] == attempt:
        return started[1] + start_timeout_s
    orphaned = None if provisioning else orphan_deadline(state, inst, start_timeout_s)
    if orphaned is not None:
        return orphaned
    if inst.get("launch_time"):  # an agent a dead controller did start has reported long before this
        return inst["launch_time"] + state.cfg.boot_timeout_s + ADOPTED_REPORT_S
    return None


def instances_of(state: ProvisioningState, run_id: str) -> list[dict]:
    """The instances of the run's newest attempt that still live, in node order (or the instance of that id)."""
    found = [
        i
        for i in state.live()
        if run_id in (i["run"], i["instance_id"]) or any(slot_run(v) == run_id for v in i["slots"].values())
    ]
    newest = max((int(i["attempt"]) for i in found if i["attempt"].isdigit()), default=None)
    return sorted((i for i in found if newest is None or i["attempt"] == str(newest)), key=lambda i: i["instance_id"])


def instance_of(state: ProvisioningState, run_id: str) -> dict | None:
    """Node 0 of the run's newest attempt (or the instance of that id)."""
    nodes = instances_of(state, run_id)
    return nodes[0] if nodes else None


def live_instance(state: ProvisioningState, iid: str) -> dict | None:
    """The instance of that id, when it is pending or running."""
    return next((i for i in state.live() if i["instance_id"] == iid), None)
