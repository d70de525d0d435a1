"""The aws backend: each attempt of a run gets its own EC2 (spot) instance, or N of them for a run
with `resources: nodes: N`.

start() returns at once; a worker thread (provision.py) acquires the instance(s) (CreateFleet),
waits for sshd, checks the pinned host key, uploads the code bundle once and starts the agent(s)
in tmux. Instances are tagged with their run and attempt from birth, so list() — one
DescribeInstances per pass — counts them as the run's hosts while they boot, and a controller
started again after a crash adopts them. The nodes of an attempt are ranked by instance id.
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

from orchestrator import contract
from orchestrator.aws import ec2 as api
from orchestrator.aws import fleet, iam
from orchestrator.aws.images import resolve_image
from orchestrator.aws.pricing import CostLedger, PriceBook
from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.aws.pack import PackMixin
from orchestrator.backends.aws.provision import ProvisionMixin
from orchestrator.backends.base import ACQUIRING, BackendBase, Host, Outcome
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.host.slots import slot_run
from orchestrator.remote.ssh import (
    Target,
    attach_argv,
    connect,
    interactive,
    known_hosts_file,
    public_key_of,
)
from orchestrator.store import open_store
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.s3url import is_s3, parse_s3
from orchestrator.sweep.packing import describe as describe_packing
from orchestrator.sweep.packing import packs, rank
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.sweep.tasks import new_task

log = logging.getLogger("orch.aws")
STOP_WAIT_S = 30.0
AGENT_REPORT_S = 120.0  # from the agent's start until its first report (a cold volume makes the first start slow)
ADOPTED_REPORT_S = 60.0  # the same, past the boot allowance, for an instance this controller did not provision


class AwsBackend(PackMixin, ProvisionMixin, BackendBase):
    name = "aws"
    poll_s = 2.0
    stale_s = 180.0  # agents heartbeat every 10 s

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.cfg = sweep.spec.aws
        self.name_ = sweep.spec.name
        self.ec2 = api.client("ec2", self.cfg.region)
        self.blocklist = fleet.Blocklist()
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="orch-provision")
        self.fatal: Optional[OrchError] = None
        self.pending: Dict[str, int] = {}  # run -> attempt being provisioned (before its instance shows up)
        self.lock = threading.Lock()
        self.outcomes: "queue.Queue[Outcome]" = queue.Queue()  # provisioning threads report here; the controller writes
        self._setup_lock = threading.Lock()  # provisioning threads share one bootstrap
        self.start_timeout_s = AGENT_REPORT_S
        self.ready: Dict[str, tuple] = {}  # run -> (attempt, when its agent was started) by this controller
        self.python: Optional[str] = None  # the instance interpreter, checked on the first host
        self.nodes = sweep.spec.resources.nodes if sweep.spec.resources else 1  # instances per attempt
        self.groups: Dict[str, str] = {}  # AZ -> the sweep's cluster placement group there (multi-node runs)
        self.gpus: Dict[str, int] = {}  # instance type -> GPUs (for GPU-hours in the cost ledger)
        self.packing = False  # runs share multi-GPU instances (decided at bootstrap: orchestrator/sweep/packing.py)
        self.pack_order: list = []  # packing.PackChoice, the best home for new shared instances first
        self.pack_lock = threading.Lock()  # one placement decision at a time
        self.reserved: Dict[str, set] = {}  # instance -> slots being claimed by this controller (not tagged yet)
        self.fresh: Dict[
            str, tuple
        ] = {}  # instance -> (slots, host key, acquired at): just acquired, maybe not listed yet
        self.dead: set = set()  # shared instances found terminating
        self._setup: Optional[dict] = None
        self._bundle: Optional[code_bundle.Bundle] = None
        self.store = open_store(sweep.store_url)
        self.ledger = CostLedger(
            self.store, self.name_, PriceBook(lambda types, azs: api.spot_prices(self.ec2, types, azs))
        )

    # --- per-sweep resources ---------------------------------------------------------------------

    def bootstrap(self) -> dict:
        """Subnets, image, security group, instance profile and launch template (created once)."""
        with self._setup_lock:
            return self._bootstrap()

    def _bootstrap(self) -> dict:
        if self._setup is None:
            from botocore.exceptions import BotoCoreError, ClientError

            cfg, sweep = self.cfg, self.name_
            try:
                subnets = api.resolve_subnets(self.ec2, cfg.subnet_ids, cfg.region)
                image = resolve_image(self.ec2, cfg.image, cfg.image_owner, cfg.region)
                sg = cfg.security_group or api.ensure_security_group(
                    self.ec2, sweep, subnets[0]["VpcId"], cfg.ssh_cidr or api.caller_cidr()
                )
                profile = cfg.instance_profile
                if profile == "create":
                    store = parse_s3(self.sweep.store_url)
                    sources = [e.source for e in self.sweep.spec.data or []]
                    buckets = [store.bucket] + [parse_s3(u).bucket for u in sources if is_s3(u)]
                    profile = iam.ensure_instance_profile(
                        api.client("iam", cfg.region),
                        sweep,
                        store.bucket,
                        store.prefix,
                        sources,
                        iam.bucket_kms_keys(api.client("s3", cfg.region), buckets),
                    )
                public_ip = cfg.ssh.address == "public_ip" and not all(s["MapPublicIpOnLaunch"] for s in subnets)
                data = api.launch_template_data(image, sg, cfg.volume_gb, profile, public_ip)
                template = api.ensure_launch_template(self.ec2, sweep, data)
            except (ClientError, BotoCoreError) as exc:
                raise api.explain(exc, "preparing the sweep's AWS resources") from None
            choices = fleet.offered_choices(self.ec2, cfg.instance_types, subnets, cfg.region)
            self._plan_packing(sorted({s["AvailabilityZone"] for s in subnets}))
            # Each instance gets a template version of its own from exactly this data (today's image, group, volume,
            # profile) plus its user data: a template made by an earlier launch never pins an older (or deleted)
            # image after `orch ami build --force` / `orch ami rm`, and no DescribeLaunchTemplateVersions answer
            # (response fields such as MetadataOptions.State) is ever posted back as a request.
            self._setup = {"template": template, "base": data, "choices": choices, "image": image, "sg": sg}
        return self._setup

    def _plan_packing(self, azs: List[str]) -> None:
        self.gpus.update(api.gpu_counts(self.ec2, self.cfg.instance_types))
        resources = self.sweep.spec.resources
        self.packing = packs(resources, {t: self.gpus.get(t, 0) for t in self.cfg.instance_types})
        if self.packing:
            self.pack_order = self._pack_order(self.gpus, api.spot_prices(self.ec2, self.cfg.instance_types, azs))
            log.info("packing: %s", ", ".join(f"{c.instance_type} ({c.slots} per instance)" for c in self.pack_order))

    def _parallel(self) -> int:
        return min(self.sweep.spec.max_parallel, len(self.sweep.runs))

    def _pack_order(self, gpus: Dict[str, int], prices: Dict[tuple, float]) -> list:
        """Homes for packed runs, best first, from GPU counts and spot prices per (type, AZ) (its cheapest AZ)."""
        by_type = {
            t: min((p for (tt, _), p in prices.items() if tt == t), default=None) for t in self.cfg.instance_types
        }
        return rank(self.cfg.instance_types, gpus, by_type, self.sweep.spec.resources.gpus, self._parallel())

    def preflight(self) -> None:
        """Everything that can fail before a launch: credentials, bucket, AMI, subnets."""
        store = open_store(self.sweep.store_url)
        store.check()
        public_key_of(self.cfg.ssh.identity)
        self.bootstrap()

    def plan(self) -> dict:
        """What a launch would ask for: (type, AZ) choices with their current spot price, and a cost bound."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            subnets = api.resolve_subnets(self.ec2, self.cfg.subnet_ids, self.cfg.region)
            azs = sorted({s["AvailabilityZone"] for s in subnets})
            prices = api.spot_prices(self.ec2, self.cfg.instance_types, azs)
            gpus = api.gpu_counts(self.ec2, self.cfg.instance_types)
            image = resolve_image(self.ec2, self.cfg.image, self.cfg.image_owner, self.cfg.region)
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, "reading spot prices and instance types") from None
        rows = [
            {"type": t, "az": az, "spot_usd_per_h": prices.get((t, az)), "gpus": gpus.get(t)}
            for t in self.cfg.instance_types
            for az in azs
        ]
        known = [r["spot_usd_per_h"] for r in rows if r["spot_usd_per_h"] is not None]
        hours = (self.sweep.spec.timeout_minutes or self.cfg.max_minutes) / 60
        dearest = max(known) if known else None  # a bound over whichever choice the fleet takes
        instances = (
            len(self.sweep.runs) * self.nodes
        )  # every node of a run is an instance billed (packing only lowers it)
        packing: List[str] = []
        if packs(self.sweep.spec.resources, gpus):
            packing = describe_packing(self._pack_order(gpus, prices), self.sweep.spec.resources.gpus, self._parallel())
        return {
            "choices": rows,
            "runs": len(self.sweep.runs),
            "hours_per_run_max": hours,
            "image": f"{image['ImageId']} ({image['Name']})",
            "nodes_per_run": self.nodes,
            "packing": packing,
            "estimate_usd_max": round(dearest * hours * instances, 2) if dearest is not None else None,
            "unpriced_choices": len(rows) - len(known),
        }

    # --- the Backend interface ------------------------------------------------------------------

    def list(self) -> List[Host]:
        if self.fatal is not None:
            raise self.fatal
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            instances = api.sweep_instances(self.ec2, self.name_, ["pending", "running"])
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, "listing the sweep's instances") from None
        with self.lock:
            pending, ready = dict(self.pending), dict(self.ready)
        self.ledger.observe(
            [i["instance_id"] for i in instances],
            {i["instance_id"]: [slot_run(v) for v in i["slots"].values()] for i in instances if i["slot_count"]},
        )
        hosts = []
        ranks = {}  # (run, attempt) -> its instance ids in rank order
        for i in sorted(instances, key=lambda i: i["instance_id"]):
            ranks.setdefault((i["run"], i["attempt"]), []).append(i["instance_id"])
        for i in instances:
            if i["slot_count"]:  # a shared instance: one host per run on it
                hosts += self._packed_hosts(i, pending, ready)
                continue
            if not i["run"]:
                continue
            attempt = int(i["attempt"]) if i["attempt"].isdigit() else None
            hosts.append(
                Host(
                    run_id=i["run"],
                    host_id=i["instance_id"],
                    address=self._address(i),
                    attempt=attempt,
                    provisioning=pending.get(i["run"]) == attempt,
                    start_deadline=self._deadline(i, attempt, ready),
                    node=ranks[(i["run"], i["attempt"])].index(i["instance_id"]),
                    nodes=self.nodes,
                )
            )
        seen = {h.run_id for h in hosts}
        hosts += [
            Host(run_id=r, host_id=ACQUIRING, address="", attempt=a, provisioning=True, nodes=self.nodes)
            for r, a in pending.items()
            if r not in seen
        ]
        return hosts

    def _deadline(self, inst: dict, attempt: Optional[int], ready: Dict[str, tuple]) -> Optional[float]:
        """When the agent on this instance must have reported: counted from when this controller
        started it, or, for an instance it did not provision (a controller restarted after a
        crash), from its launch plus the whole boot allowance."""
        started = ready.get(inst["run"])
        if started and started[0] == attempt:
            return started[1] + self.start_timeout_s
        if inst.get("launch_time"):  # an agent a dead controller did start has reported long before this
            return inst["launch_time"] + self.cfg.boot_timeout_s + ADOPTED_REPORT_S
        return None

    def notify_interruption(self, run_id: str) -> bool:
        """The agent's view of a spot notice (IMDS cannot be faked on a real instance): its ctl file."""
        inst = self._instance_of(run_id)
        if inst is None:
            return False
        conn = connect(self._target(inst), timeout=30)
        try:
            conn.put_bytes(b"chaos\n", contract.notice_path(self._ctl(inst["run"])), mode=0o644)
        finally:
            conn.close()
        return True

    def _ctl(self, run_id: str) -> str:
        return contract.ctl_dir(contract.REMOTE_BASE, self.name_, run_id)

    def spend(self) -> float:
        return self.ledger.spend()

    def release(self, host: Host) -> None:
        if host.host_id == ACQUIRING:
            return
        if host.slot >= 0:
            self._release_packed(host)
        else:
            api.terminate(self.ec2, [host.host_id])

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        cfg = self.cfg
        return new_task(
            self.sweep,
            run_id,
            attempt,
            command,
            params_json,
            contract.REMOTE_BASE,
            heartbeat_s=cfg.heartbeat_s,
            sync_s=cfg.sync_s,
            host="",
            replaces=replaces,
            terminate_on_exit=not cfg.keep_alive,
            imds=True,
            notice_poll_s=5.0,
            idle_s=cfg.idle_minutes * 60 if cfg.keep_alive and cfg.idle_minutes else None,
        )

    def start(self, task: RunTask) -> Host:
        with self.lock:
            if task.run_id in self.pending:
                raise OrchError(f"run {task.run_id} is already being provisioned")
            self.pending[task.run_id] = task.attempt
        self.pool.submit(self._dispatch, task)
        return Host(run_id=task.run_id, host_id="(acquiring)", address="")

    def _dispatch(self, task: RunTask) -> None:
        try:
            self.bootstrap()  # decides packing; a failure is reported by the provisioning itself
        except Exception:
            pass
        (self._provision_packed if self.packing else self._provision)(task)

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """Every node's agent stops its command (node 0 first: it writes the reason), then the instances go."""
        nodes = self._instances_of(run_id)
        if not nodes:
            return False
        for inst in nodes:
            try:
                conn = connect(self._target(inst), timeout=20)
                try:
                    conn.run(
                        contract.stop_script(
                            self._ctl(run_id),
                            contract.session_name(self.name_, run_id),
                            reason,
                            STOP_WAIT_S,
                            contract.REMOTE_TMUX_SOCKET,
                        ),
                        timeout=STOP_WAIT_S + 30,
                    )
                finally:
                    conn.close()
            except OrchError as exc:
                log.warning("could not stop %s on %s gracefully: %s", run_id, inst["instance_id"], exc)
        alone = [i for i in nodes if not i["slot_count"] or all(slot_run(v) == run_id for v in i["slots"].values())]
        for inst in nodes:  # a shared instance stays for its other runs: only this run's slot goes
            if inst not in alone:
                for k, v in inst["slots"].items():
                    if slot_run(v) == run_id:
                        self._free_claim(inst["instance_id"], k, v, reason, inst)
        api.terminate(self.ec2, [inst["instance_id"] for inst in alone])
        return True

    def attach(self, run_id: str, node: int = 0) -> int:
        """An interactive terminal in the run's tmux window on node `node`: system ssh when there is one, paramiko
        otherwise."""
        import shutil

        nodes = self._instances_of(run_id)
        if not nodes:
            raise OrchError(f"run {run_id} has no running instance. See its log with `orch logs {run_id}`.")
        if node >= len(nodes):
            raise OrchError(f"run {run_id} runs on {len(nodes)} node(s) now: --node takes 0 to {len(nodes) - 1}.")
        inst = nodes[node]
        target = self._target(inst)
        remote = (
            f"tmux -L {contract.REMOTE_TMUX_SOCKET} attach-session -t "
            f"{shlex.quote('=' + contract.session_name(self.name_, inst['run']) + ':run')}"
        )
        if shutil.which("ssh") is None:
            return interactive(target, remote)
        argv = attach_argv(target, remote, known_hosts_file(target, orch_home() / "known_hosts"))
        os.execvp(argv[0], argv)
        return 0

    def teardown(self) -> List[str]:
        from orchestrator.aws.teardown import teardown

        return teardown(self.ec2, api.client("iam", self.cfg.region), self.name_)

    def drain_outcomes(self) -> List[Outcome]:
        out = []
        while not self.outcomes.empty():
            outcome = self.outcomes.get_nowait()
            with self.lock:
                if self.pending.get(outcome.run_id) == outcome.attempt:
                    self.pending.pop(outcome.run_id)
            out.append(outcome)
        return out

    # --- helpers ----------------------------------------------------------------------------------

    def _address(self, inst: dict) -> str:
        return inst.get("private_ip" if self.cfg.ssh.address == "private_ip" else "public_ip") or ""

    def _instance_of(self, run_id: str) -> Optional[dict]:
        """Node 0 of the run's newest attempt (or the instance of that id)."""
        nodes = self._instances_of(run_id)
        return nodes[0] if nodes else None

    def _instances_of(self, run_id: str) -> List[dict]:
        """The instances of the run's newest attempt that still live, in node order (or the instance of that id)."""
        found = [
            i
            for i in api.sweep_instances(self.ec2, self.name_, ["pending", "running"])
            if run_id in (i["run"], i["instance_id"]) or any(slot_run(v) == run_id for v in i["slots"].values())
        ]
        newest = max((int(i["attempt"]) for i in found if i["attempt"].isdigit()), default=None)
        return sorted(
            (i for i in found if newest is None or i["attempt"] == str(newest)), key=lambda i: i["instance_id"]
        )

    def _target(self, inst: dict) -> Target:
        if not inst.get("host_key"):
            raise OrchError(
                f"{inst['instance_id']} carries no pinned host key (tag orch:hostkey); refusing to connect."
            )
        return Target(
            self._address(inst), self.cfg.ssh.port, self.cfg.ssh.user, self.cfg.ssh.identity, inst["host_key"]
        )

    def run_of_instance(self, instance_id: str) -> Optional[str]:
        inst = self._instance_of(instance_id)
        return inst["run"] if inst else None
