"""`orch launch --dry-run` on Slurm: what each job asks for, Slurm's verdict on it, and what it would cost."""

from __future__ import annotations

from orchestrator.sweep.spec import Sweep


def plan_lines(sweep: Sweep, plan: dict) -> list[str]:
    where = f"through {plan['login']}" if plan.get("login") else "with Slurm's commands here"
    lines = [f"Slurm {plan['version']} {where}: one job per run, at most {plan['jobs']} queued or running at once"]
    asks = [f"{plan.get('nodes', 1)} node(s)", f"partition {plan['partition'] or '(the default)'}"]
    asks.append(f"time {plan['time'] or '(the partition limit)'}")
    asks += [f"account {plan['account']}"] if plan.get("account") else []
    asks += [f"qos {plan['qos']}"] if plan.get("qos") else []
    asks.append(f"{plan['gpus']} GPU(s) per node" if plan["gpus"] else "no GPU")
    lines.append("each job: " + ", ".join(asks) + f"; told to checkpoint {plan['warn_s']} s before its time limit")
    lines.append("sbatch " + " ".join(plan["sbatch"]))
    lines.append(
        f"Slurm refuses these options: {plan['verdict']}" if plan["verdict"] else "Slurm accepts these options"
    )
    price = plan.get("price")
    lines.append(
        f"price: ${price:.2f} per GPU-hour"
        if price is not None
        else "no price given (`slurm.price_per_gpu_hour`): `orch collect` counts GPU-hours, not dollars"
    )
    return lines
