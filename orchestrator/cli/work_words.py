"""What `orch collect` says of the work bought per instance type (aws: `aws.choose`, backends/aws/cloud/worth.py
realized)."""

from __future__ import annotations

from orchestrator.control.views import usd


def per_h(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def work_words(work: dict | None) -> list[str]:
    """aws: the work bought per instance type, and what ranking by the hour alone would have spent on it."""
    if not work:
        return []
    out = [
        f"work on {t['type']}: {per_h(t['units_per_h'])}/h measured ({t['attempts']} attempt(s)), {usd(t['usd'])} for "
        f"{t['units']:.4g} units" + (f" = {usd(t['usd_per_unit'])} per unit" if t.get("usd_per_unit") else "")
        for t in work.get("types") or []
    ]
    hour = work.get("by_the_hour")
    if hour and hour.get("usd"):
        saved = hour["usd"] - hour["work_usd"]
        out.append(
            f"the work's own hours cost {usd(hour['work_usd'])} where it ran; by the hour alone (all on "
            f"{hour['type']}, at its measured rate) about {usd(hour['usd'])}: ranking by $ per unit "
            f"{'saved' if saved >= 0 else 'cost'} {abs(saved) / hour['usd']:.0%} (an estimate from the same "
            "measurements: docs/guides/costs.md)"
        )
    return out


def deadline_words(d: dict | None) -> list[str]:
    """`deadline:` — met or not, and what the markets cost against all-spot and all-on-demand estimates."""
    if not d:
        return []
    out = [f"deadline: {d['outcome']}"]
    if "usd" in d:
        usd_by, hours = d["usd"], d["hours"]
        out.append(
            f"  on-demand {hours['on-demand']:.2f} instance-h for {usd(usd_by['on-demand'])}, spot "
            f"{hours['spot']:.2f} instance-h for {usd(usd_by['spot'])}; the same hours all on spot about "
            f"{usd(d['all_spot_usd'])}, all on-demand about {usd(d['all_on_demand_usd'])}"
        )
    return out
