"""The aws backend: each attempt of a run gets its own EC2 (spot) instance, or N of them for a run
with `resources: nodes: N`.

start() returns at once; a worker thread (provision.py) acquires the instance(s) (CreateFleet),
waits for sshd, checks the pinned host key, uploads the code bundle once and starts the agent(s)
in tmux. Instances are tagged with their run and attempt from birth, so list() — one
DescribeInstances per pass — counts them as the run's hosts while they boot, and a controller
started again after a crash adopts them. The nodes of an attempt are ranked by instance id.

AwsBackend composes its parts, each given the one ProvisioningState (state.py) they share: setup.py (the sweep's
resources, once, and the dry run's plan), Provisioner (provision.py), Packer (pack.py) and listing.py (hosts).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import shlex
import time
from concurrent.futures import ThreadPoolExecutor

from orchestrator import contract
from orchestrator.backends.aws import bought, listing
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud.images import ImageNotReady
from orchestrator.backends.aws.pack import Packer
from orchestrator.backends.aws.provision import Provisioner
from orchestrator.backends.aws.regions import check_regions, home_region, settings
from orchestrator.backends.aws.settings import LOST_AFTER_S
from orchestrator.backends.aws.setup import bootstrap, check_first_region, copy_recipe_image, plan, prepare_regions
from orchestrator.backends.aws.state import ProvisioningState, work_key
from orchestrator.backends.base import ACQUIRING, BackendBase, Host, Outcome
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.host.aws.slots import slot_attempt, slot_run
from orchestrator.remote.ssh import attach_argv, connect, interactive, known_hosts_file, public_key_of
from orchestrator.store.lifecycle import RunStatus, StopReason
from orchestrator.store.s3 import S3Store
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.sweep.tasks import new_task

log = logging.getLogger("orch.aws")
STOP_WAIT_S = 30.0
AGENT_REPORT_S = 120.0  # from the agent's start until its first report (a cold volume makes the first start slow)
SPOT_SEEN_S = 600.0  # `deadline:` moves a run back to spot only when the sweep got a spot instance this recently


class AwsBackend(BackendBase):
    """The Backend interface over EC2. Its parts share one ProvisioningState (state.py), given to each explicitly:
    the Provisioner (provision.py) acquires and starts attempts and settles their failures, the Packer (pack.py)
    places runs on shared instances; bootstrap and plan are setup.py's, the hosts of a listing listing.py's."""

    name = "aws"
    poll_s = 2.0
    stale_s = LOST_AFTER_S  # agents heartbeat every 60 s (aws.heartbeat_s): checks.py makes three beats fit

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.cfg = settings(sweep)
        self.name_ = sweep.spec.name
        self.state = ProvisioningState.of(sweep)
        self.provisioner = Provisioner(self.state)
        self.packer = Packer(self.state, self.provisioner)
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="orch-provision")
        self.start_timeout_s = AGENT_REPORT_S

    @property
    def ec2(self):
        return self.state.ec2

    # --- per-sweep resources ---------------------------------------------------------------------

    def bootstrap(self) -> dict:
        """Subnets, image, security group, instance profile and launch template (created once)."""
        return bootstrap(self.state)

    def preflight(self) -> None:
        """Everything that can fail before a launch: credentials, bucket, AMI, subnets."""
        S3Store(self.sweep.store_url).check()  # an aws sweep's store is a bucket (checks.py)
        home = home_region(self.sweep)
        check_regions(self.sweep, home)
        self.state.ledger.home = home  # the store's region: what hosts elsewhere move to and from it is transfer
        public_key_of(self.cfg.ssh.identity)
        check_first_region(self.state)  # before any region's parts are made
        copy_recipe_image(self.state)  # into each region that lacks it, before the first region's resources
        ahead = prepare_regions(self.state)  # the other regions' parts, side by side with the first's
        try:
            self.bootstrap()
        except ImageNotReady as exc:  # the first region decides packing: its image must be there before a launch
            first = self.cfg.regions[0]
            raise OrchError(
                f"{exc}. The first region listed must have the image before a launch: launch again once `orch ami "
                f"list --region {first}` shows it available, or list first a region that has it. No instance was "
                "launched.",
                exit_code=2,
            ) from None
        finally:
            if ahead is not None:
                ahead.shutdown(wait=True)
        self.state.work.keep()  # what earlier sweeps in the store measured, for this sweep's controllers (earlier.py)

    def plan(self) -> dict:
        """What a launch would ask for: (type, AZ) choices with their current spot price, and a cost bound."""
        self.state.work.gather()  # ranked with what earlier sweeps in the store measured, as a launch would
        return plan(self.state)

    # --- the Backend interface ------------------------------------------------------------------

    def list(self) -> builtins.list[Host]:
        if self.state.fatal is not None:
            raise self.state.fatal
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            instances = self.state.live()
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, "listing the sweep's instances") from None
        pending, ready = self.state.in_flight()
        self.state.ledger.observe(
            [i["instance_id"] for i in instances],
            {i["instance_id"]: [slot_attempt(v) for v in i["slots"].values()] for i in instances if i["slot_count"]},
        )
        return listing.hosts(self.state, instances, pending, ready, self.start_timeout_s)

    def notify_interruption(self, run_id: str) -> bool:
        """The agent's view of a spot notice (IMDS cannot be faked on a real instance): its ctl file — the run's own on
        a shared instance (a `deadline:` move is one run's; the instance's tag names no run there)."""
        inst = listing.instance_of(self.state, run_id)
        if inst is None:
            return False
        run = inst["run"] if run_id == inst["instance_id"] else run_id
        conn = connect(self.state.target(inst), timeout=30)
        try:
            conn.put_bytes(b"chaos\n", contract.notice_path(self.state.ctl(run)), mode=0o644)
        finally:
            conn.close()
        return True

    @property
    def hosts_outlive_runs(self) -> bool:
        return self.cfg.keep_alive

    def spend(self) -> float:
        return self.state.ledger.spend()

    def places(self) -> dict[str, dict[int, str]]:
        return self.state.ledger.places()

    def flush(self) -> None:
        self.state.ledger.flush()

    def release(self, host: Host) -> None:
        if host.host_id == ACQUIRING:
            return
        if host.slot >= 0:
            self.packer.release(host)
        else:
            api.terminate(self.state.ec2_of(host.host_id), [host.host_id])

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
            host_parts=[contract.HOST_NOTICES] + ([] if cfg.keep_alive else [contract.SELF_TERMINATE]),
            notice_poll_s=5.0,
            idle_s=cfg.idle_minutes * 60 if cfg.keep_alive and cfg.idle_minutes else None,
            work_key=work_key(self.sweep),
        )

    def start(self, task: RunTask) -> Host:
        self.state.begin(task.run_id, task.attempt)
        self.state.pin_market(task.run_id)  # `deadline:`: the market this pass decided, for the thread that buys
        self.pool.submit(self._dispatch, task)
        return Host(run_id=task.run_id, host_id="(acquiring)", address="")

    def _dispatch(self, task: RunTask) -> None:
        prepare_regions(self.state)  # the other regions' parts in the background: a failover finds them made
        with contextlib.suppress(Exception):  # a failure is reported by the provisioning itself
            self.bootstrap()  # decides packing
        (self.packer.provision if self.state.packing else self.provisioner.provision)(task)

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """Every node's agent stops its command (node 0 first: it writes the reason), then the instances go."""
        nodes = listing.instances_of(self.state, run_id)
        if not nodes:
            return False
        for inst in nodes:
            try:
                conn = connect(self.state.target(inst), timeout=20)
                try:
                    conn.run(
                        contract.stop_script(
                            self.state.ctl(run_id),
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
                        self.packer.free_claim(inst["instance_id"], k, v, reason, inst)
        for inst in alone:
            api.terminate(self.state.ec2_of(inst["instance_id"]), [inst["instance_id"]])
        return True

    def attach(self, run_id: str, node: int = 0) -> int:
        """An interactive terminal in the run's tmux window on node `node`: system ssh when there is one, paramiko
        otherwise."""
        import shutil

        nodes = listing.instances_of(self.state, run_id)
        if not nodes:
            raise OrchError(f"run {run_id} has no running instance. See its log with `orch logs {run_id}`.")
        if node >= len(nodes):
            raise OrchError(f"run {run_id} runs on {len(nodes)} node(s) now: --node takes 0 to {len(nodes) - 1}.")
        inst = nodes[node]
        target = self.state.target(inst)
        remote = (
            f"tmux -L {contract.REMOTE_TMUX_SOCKET} attach-session -t "
            f"{shlex.quote('=' + contract.session_name(self.name_, inst['run']) + ':run')}"
        )
        if shutil.which("ssh") is None:
            return interactive(target, remote)
        argv = attach_argv(target, remote, known_hosts_file(target, orch_home() / "known_hosts"))
        os.execvp(argv[0], argv)
        return 0

    def teardown(self) -> builtins.list[str]:
        from orchestrator.backends.aws.cloud.teardown import teardown

        iam = api.client("iam", self.cfg.region)
        # every region the sweep may use, and its home (a --remote controller's): one it never used holds nothing
        try:
            home = [home_region(self.sweep)]
        except OrchError as exc:  # the bucket gone or unreadable: what the sweep's regions hold still goes
            log.warning("%s; removing what the sweep's regions hold", exc)
            home = []
        regions = list(dict.fromkeys([*self.cfg.regions, *home]))
        if len(regions) == 1:
            return teardown(self.ec2, iam, self.name_)
        return [f"{r}: {x}" for r in regions for x in teardown(self.state.part(r).ec2, iam, self.name_)]

    def took_over(self) -> None:
        self.state.orphans_before = time.time()

    def drain_outcomes(self) -> builtins.list[Outcome]:
        return self.state.drain()

    def learn(self, statuses: dict[str, RunStatus]) -> None:
        self.state.work.learn(statuses)  # the attempts' work rates (backends/aws/work.py)

    def buy_on_demand(self, runs: frozenset[str]) -> None:
        self.state.on_demand = runs  # one assignment: the provisioning threads read it (state.markets_for)

    def markets(self) -> dict[str, str]:
        return bought.newest(self.state.ledger.runs_entries(), "market")

    def switch_s(self) -> float | None:
        return self.state.work.switch_s() or self.cfg.switch_s  # measured, else `aws.switch_s` (assumed)

    def work_scale(self) -> dict[str, float]:
        return self.state.work.scale(list(self.cfg.instance_types))

    def spot_there(self) -> bool:
        """The sweep got a spot instance in the last SPOT_SEEN_S (its ledger: a relaunch knows it too), and not every
        spot pool set up so far refused spot since (a capacity error blocks a pool for cloud/pools.py's BLOCK_S)."""
        newest = bought.newest_start(self.state.ledger.runs_entries(), "spot")
        if newest is None or time.time() - newest > SPOT_SEEN_S:
            return False
        choices = [c for part in list(self.state.parts.values()) if part.setup for c in part.setup["choices"]]
        return not choices or bool(self.state.blocklist.allowed(choices, "spot"))

    def run_of_instance(self, host_id: str) -> str | None:
        inst = listing.instance_of(self.state, host_id)
        return inst["run"] if inst else None
