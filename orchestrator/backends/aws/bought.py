"""What a sweep's runs were bought as, from its cost ledger (cloud/pricing.py): the market and the instance type of each
run's newest attempt, and when the sweep last got an instance in a market. `deadline:` reads them (the schedule's
markets, the work scale of work.py, whether spot is likely there)."""

from __future__ import annotations

from orchestrator.backends.aws.cloud.pricing import attempts_on


def newest(entries: list[dict], field: str) -> dict[str, str]:
    """run -> `field` (market, type) of the instance of its newest attempt (a shared instance: each of its runs)."""
    found: dict[str, tuple[int, str]] = {}
    for e in entries:
        for run, attempt in attempts_on(e):
            if attempt >= found.get(run, (-1, ""))[0]:
                found[run] = (attempt, str(e.get(field) or ""))
    return {run: value for run, (_, value) in found.items()}


def newest_start(entries: list[dict], market: str) -> float | None:
    """When the newest of these instances in `market` was bought."""
    starts = [e.get("start") for e in entries if e.get("market") == market]
    return max((s for s in starts if isinstance(s, (int, float))), default=None)
