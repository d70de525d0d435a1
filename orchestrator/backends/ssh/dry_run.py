"""`orch launch --dry-run` on ssh hosts: each host with what it offers this sweep, or why it is left out."""

from __future__ import annotations

from orchestrator.sweep.spec import Sweep


def plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    """The dry run's hosts in words."""
    usable = [h for h in plan["hosts"] if "why" not in h]
    slots = sum(h["slots"] for h in usable)
    lines = [f"hosts: {len(usable)} of {len(plan['hosts'])} can run this sweep, {slots} run(s) at once"]
    for h in plan["hosts"]:
        if "why" in h:
            lines.append(f"  {h['host']}: left out: {h['why'].removeprefix(h['host'] + ': ')}")
        else:
            lines.append(f"  {h['host']}: {h['gpus']} GPU(s), {h['slots']} slot(s), {h['python']}")
    price = plan.get("price_per_hour")
    lines.append(
        f"price: ${price:.2f} per host-hour (shared by the runs a host holds)"
        if price is not None
        else "no price given (`ssh.price_per_hour`): `orch collect` counts GPU-hours, not dollars"
    )
    return lines
