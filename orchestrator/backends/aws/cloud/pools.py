"""The pools a sweep may ask CreateFleet for — (instance type, subnet) choices — and which of them are blocked for a
while after EC2 refused them (cloud/fleet.py asks; cloud/worth.py weighs them)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

BLOCK_S = 300.0  # how long a pool stays blocked after a capacity error
NEVER_S = float("inf")  # a pool the AZ does not offer: blocked for the rest of the sweep
# a market refused for its quota is asked again this soon: the sweep's own instances free it as they end
QUOTA_BLOCK_S = 30.0


@dataclass
class Choice:
    """An (instance type, subnet) pair CreateFleet may use."""

    instance_type: str
    subnet_id: str
    az: str
    # CreateFleet's WeightedCapacity (cloud/worth.py: the pool's effective work rate, the slowest 1); None: unweighted
    weight: float | None = None


@dataclass
class Blocklist:
    """Pools to avoid for a while, per market: spot capacity says nothing about on-demand capacity.

    Hard blocks follow a capacity error (AWS just said no). Soft blocks follow a reclaim: that
    pool is tight, so other choices go first, but it is still tried when nothing else is left.
    """

    until: dict[tuple[str, str, str], float] = field(default_factory=dict)
    soft_until: dict[tuple[str, str], float] = field(default_factory=dict)
    # market -> (until, what AWS said): asked again sooner
    quota: dict[str, tuple[float, str]] = field(default_factory=dict)
    unsupported: dict[tuple[str, str], str] = field(default_factory=dict)  # pool -> what AWS said (CONFIG_ERRORS)

    def refuse(self, instance_type: str, subnet_id: str, said: str) -> None:
        """A pool whose configuration EC2 does not support: never asked again, and why is kept."""
        self.never(instance_type, subnet_id)
        self.unsupported[(instance_type, subnet_id)] = said

    def all_unsupported(self, choices: list[Choice]) -> str | None:
        """What AWS said, when every choice was refused as unsupported (nothing to wait for)."""
        said = [self.unsupported.get((c.instance_type, c.subnet_id)) for c in choices]
        known = [s for s in said if s]
        return "; ".join(dict.fromkeys(known)) if said and len(known) == len(said) else None

    def block(self, market: str, instance_type: str, subnet_id: str, seconds: float = BLOCK_S) -> None:
        self.until[(market, instance_type, subnet_id)] = time.time() + seconds

    def never(self, instance_type: str, subnet_id: str) -> None:
        """A pool that does not exist (its AZ does not offer the type): in no market, for the rest of the sweep."""
        for market in ("spot", "on-demand"):
            self.block(market, instance_type, subnet_id, NEVER_S)

    def avoid(self, instance_type: str, subnet_id: str, seconds: float = BLOCK_S) -> None:
        self.soft_until[(instance_type, subnet_id)] = time.time() + seconds

    def allowed(self, choices: list[Choice], market: str) -> list[Choice]:
        now = time.time()
        open_ = [c for c in choices if self.until.get((market, c.instance_type, c.subnet_id), 0) <= now]
        preferred = [c for c in open_ if self.soft_until.get((c.instance_type, c.subnet_id), 0) <= now]
        return preferred or open_
