"""What the aws backend's parts share, in one object: the sweep's clients, what its bootstrap found, the attempts
being provisioned and the shared instances being placed on — each field with the lock that guards it.

AwsBackend (backend.py) holds one ProvisioningState and hands it to its Provisioner (provision.py) and Packer
(pack.py); nothing else is shared between them.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from orchestrator import contract
from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet, worth
from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook, region_of_az
from orchestrator.backends.aws.cloud.scores import Scores, placement_scores
from orchestrator.backends.aws.regions import home_region, settings
from orchestrator.backends.aws.settings import AwsSection
from orchestrator.backends.aws.work import WorkBook
from orchestrator.backends.base import Outcome
from orchestrator.errors import OrchError
from orchestrator.remote.ssh import Target
from orchestrator.store import open_store
from orchestrator.sweep.spec import Sweep


def work_key(sweep: Sweep) -> str:
    """The metrics key that counts work: `aws.work_key`, else `prune.at`, else epoch (cloud/worth.py)."""
    spec = sweep.spec
    return settings(sweep).work_key or (spec.prune.at if spec.prune else "") or worth.DEFAULT_WORK_KEY


def spot_prices_by_region(types: list[str], azs: list[str], default: str) -> dict[tuple[str, str], float]:
    """Spot prices per (type, AZ) from each AZ's own region (a region's history names only its own AZs)."""
    by_region: dict[str, list[str]] = {}
    for az in azs:
        by_region.setdefault(region_of_az(az) or default, []).append(az)
    out: dict[tuple[str, str], float] = {}
    for region, these in by_region.items():
        out.update(api.spot_prices(api.client("ec2", region), types, these))
    return out


@dataclass
class RegionPart:
    """What the sweep has in one of its regions (docs/guides/regions.md), made when the sweep starts (setup.py:
    prepare_regions) or, failing that, when the region is first used."""

    region: str
    ec2: Any  # that region's EC2 client (boto3 clients are thread-safe)
    lock: threading.Lock = field(default_factory=threading.Lock)  # guards `setup`: one region's made at a time
    setup: dict | None = None  # its subnets' choices, image, security group, launch template (setup.bootstrap)
    groups: dict[str, str] = field(default_factory=dict)  # AZ -> the sweep's placement group there


@dataclass
class ProvisioningState:
    sweep: Sweep
    ec2: Any  # the EC2 client of the sweep's first region (boto3 clients are thread-safe)
    ledger: CostLedger  # what the sweep's instances cost (thread-safe)
    parts: dict[str, RegionPart] = field(default_factory=dict)  # region -> its part (under setup_lock)
    where: dict[str, str] = field(default_factory=dict)  # instance id -> its region (one dict item a write)
    blocklist: fleet.Blocklist = field(default_factory=fleet.Blocklist)  # pools to avoid (one dict item a write)
    fatal: OrchError | None = None  # set by a provisioning thread (one assignment); the next list() raises it
    outcomes: queue.Queue[Outcome] = field(default_factory=queue.Queue)  # provisioning threads report here

    # Guarded by `lock`: the attempts of this controller between start() and their agent's first report.
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: dict[str, int] = field(default_factory=dict)  # run -> attempt being provisioned (no instance listed yet)
    ready: dict[str, tuple] = field(default_factory=dict)  # run -> (attempt, when this controller started its agent)

    # The controller's thread only (list()): what a controller that died without handing over had bought (adopt.py).
    orphans_before: float = 0.0  # when this one took the sweep over from it: instances launched before are its
    adopted: dict[tuple, float] = field(default_factory=dict)  # (instance, run) -> when its agent must have reported

    # Written under `setup_lock`: found once per controller, by the first provisioning thread that needs it.
    setup_lock: threading.Lock = field(default_factory=threading.Lock)
    setup: dict | None = None  # the first region's part.setup (setup.bootstrap, under that part's lock)
    shared: tuple | None = None  # (instance profile, SSH CIDR): every region's parts use them (setup.shared_parts)
    prepared: bool = False  # every listed region's parts are being (or were) made ahead (setup.prepare_regions)
    bundle: code_bundle.Bundle | None = None  # the code shipped to hosts, built once
    python: str | None = None  # the instance interpreter, checked on the first host
    gpus: dict[str, int] = field(default_factory=dict)  # instance type -> GPUs (GPU-hours in the cost ledger)
    packing: bool = False  # runs share multi-GPU instances (decided at bootstrap: orchestrator/sweep/packing.py)
    recipe_sha: str = ""  # `image: recipe:NAME` over several regions: the build every region's hosts use (setup.py)
    work: Any = None  # the sweep's work rates (backends/aws/work.py: WorkBook), made with the state
    # `deadline:`: runs whose next host must be on-demand (the controller's schedule, replaced each pass)
    on_demand: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()  # runs claimed while due for on-demand (pin_market; one assignment each)

    # Guarded by `pack_lock`: one placement on a shared instance at a time (pack.py).
    pack_lock: threading.Lock = field(default_factory=threading.Lock)
    reserved: dict[str, set] = field(default_factory=dict)  # instance -> slots being claimed here (not tagged yet)
    fresh: dict[str, tuple] = field(default_factory=dict)  # instance -> (slots, host key, acquired at), maybe unlisted
    dead: set = field(default_factory=set)  # shared instances found terminating

    @classmethod
    def of(cls, sweep: Sweep) -> ProvisioningState:
        cfg = settings(sweep)
        parts = {r: RegionPart(r, api.client("ec2", r)) for r in cfg.regions}
        prices = PriceBook(lambda types, azs: spot_prices_by_region(types, azs, cfg.region))
        store = open_store(sweep.store_url)
        ledger = CostLedger(store, sweep.spec.name, prices, home=lambda: home_region(sweep))
        work = WorkBook(store, sweep.spec.name, ledger, cfg.choose, work_key(sweep), sweep.spec.command)
        state = cls(sweep, parts[cfg.regions[0]].ec2, ledger, parts, work=work)
        work.scorer = lambda: scores_now(state)  # AWS's Spot placement scores (cloud/scores.py), when ranking
        return state

    def part(self, region: str) -> RegionPart:
        """The sweep's part in `region` (one outside its list too: a --remote controller's home)."""
        part = self.parts.get(region)  # the sweep's own regions are there from the start: no lock to wait on
        if part is not None:
            return part
        with self.setup_lock:
            if region not in self.parts:
                self.parts[region] = RegionPart(region, api.client("ec2", region))
            return self.parts[region]

    def ec2_of(self, instance_id: str) -> Any:
        """The EC2 client of the region the instance is in (the first region's when unknown)."""
        region = self.where.get(instance_id)
        return self.parts[region].ec2 if region in self.parts else self.ec2

    def pin_market(self, run_id: str) -> None:
        """At a run's claim: whether the deadline's schedule wants it on on-demand now, kept for this attempt's
        acquisition (a provisioning thread asks later, when the next pass's set no longer names a run it hosts)."""
        self.pinned = self.pinned | {run_id} if run_id in self.on_demand else self.pinned - {run_id}

    def markets_for(self, run_id: str) -> list[str]:
        """The markets an acquisition for `run_id` asks, in order: `aws.market`'s, or on-demand alone when the
        deadline's schedule needed this run on on-demand at its claim or needs it now (control/schedule.py)."""
        due = run_id in self.on_demand or run_id in self.pinned
        return ["on-demand"] if due else fleet.markets(self.cfg.market)

    @property
    def cfg(self) -> AwsSection:
        return settings(self.sweep)

    @property
    def name(self) -> str:
        return self.sweep.spec.name

    @property
    def nodes(self) -> int:
        """Instances per attempt."""
        return self.sweep.spec.resources.nodes if self.sweep.spec.resources else 1

    # --- the attempts in flight ---------------------------------------------------------------

    def in_flight(self) -> tuple:
        """(pending, ready) as of now: copies, read without holding the lock."""
        with self.lock:
            return dict(self.pending), dict(self.ready)

    def begin(self, run_id: str, attempt: int) -> None:
        """The attempt is being provisioned from now on; refused when the run already is."""
        with self.lock:
            if run_id in self.pending:
                raise OrchError(f"run {run_id} is already being provisioned")
            self.pending[run_id] = attempt

    def started(self, run_id: str, attempt: int) -> None:
        """This controller started the attempt's agent(s) now: its report is due from here (listing.deadline)."""
        with self.lock:
            self.ready[run_id] = (attempt, time.time())

    def provisioned(self, run_id: str) -> None:
        """The attempt's instance(s) and agent(s) are up: list() counts the run by its instances from now on."""
        with self.lock:
            self.pending.pop(run_id, None)

    def drain(self) -> list[Outcome]:
        """Outcomes since the last call; each one ends its attempt's pending entry."""
        out = []
        while not self.outcomes.empty():
            outcome = self.outcomes.get_nowait()
            with self.lock:
                if self.pending.get(outcome.run_id) == outcome.attempt:
                    self.pending.pop(outcome.run_id)
            out.append(outcome)
        return out

    # --- reaching an instance -----------------------------------------------------------------

    def address(self, inst: dict) -> str:
        return inst.get("private_ip" if self.cfg.ssh.address == "private_ip" else "public_ip") or ""

    def target(self, inst: dict) -> Target:
        if not inst.get("host_key"):
            raise OrchError(
                f"{inst['instance_id']} carries no pinned host key (tag orch:hostkey); refusing to connect."
            )
        ssh = self.cfg.ssh
        return Target(self.address(inst), ssh.port, ssh.user, ssh.identity, inst["host_key"])

    def ctl(self, run_id: str) -> str:
        """The run's agent folder on an instance."""
        return contract.ctl_dir(contract.REMOTE_BASE, self.name, run_id)

    def live(self) -> list[dict]:
        """The sweep's pending and running instances, each with its `region` (one DescribeInstances per region)."""
        return self.instances(["pending", "running"])

    def instances(self, states: list[str]) -> list[dict]:
        """The sweep's instances in these states, in every region it may use, each with its `region`."""
        out = []
        for region in self.cfg.regions:
            for inst in api.sweep_instances(self.part(region).ec2, self.name, states):
                self.where[inst["instance_id"]] = region
                out.append({**inst, "region": region})
        return out


def scores_now(state: ProvisioningState) -> Scores:
    """The sweep's Spot placement scores now: its instance types in its regions, one acquisition's instances, asked in
    its first region for all of them, with the AZ ids its subnets name; never raises."""
    from botocore.exceptions import BotoCoreError, ClientError

    cfg, names = state.cfg, {}
    try:
        for r in cfg.regions:
            for s in api.resolve_subnets(state.part(r).ec2, cfg.subnet_ids if r == cfg.region else [], r):
                names[s["AvailabilityZoneId"]] = s["AvailabilityZone"]
    except (ClientError, BotoCoreError, OrchError) as exc:
        return Scores(note=f"not had (the subnets' AZ ids: {exc}): ranked without them")
    ec2 = state.part(cfg.regions[0]).ec2
    return placement_scores(ec2, cfg.instance_types, cfg.regions, max(1, state.nodes), names)
