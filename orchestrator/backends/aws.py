"""The aws backend: each attempt of a run gets its own EC2 (spot) instance.

start() returns at once; a worker thread acquires the instance (CreateFleet), waits for its sshd,
checks its pinned host key, uploads the code bundle once and starts the agent in tmux. The
instance is tagged with its run from birth, so list() — one DescribeInstances per pass — counts it
as the run's host while it boots, and a controller started again after a crash adopts it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import yaml

from .. import bundle as code_bundle
from .. import ec2 as api
from .. import fleet
from ..errors import OrchError
from .. import contract
from ..spec import AUTO_PYTHON, Sweep, orch_home
from ..ssh import Target, attach_argv, connect, interactive, known_hosts_file, new_host_key, public_key_of
from ..status import FAILED, QUEUED
from ..pricing import CostLedger, PriceBook
from ..store import open_store
from .base import ACQUIRING, BackendBase, Host, Outcome, RunTask

log = logging.getLogger("orch.aws")
STOP_WAIT_S = 30.0
AGENT_REPORT_S = 120.0  # from the agent's start until its first report (a cold volume makes the first start slow)
ADOPTED_REPORT_S = 60.0  # the same, past the boot allowance, for an instance this controller did not provision
# Where images keep an interpreter with PyTorch, best first (`aws.python: auto`).
PYTHON_CANDIDATES = ("/opt/pytorch/bin/python", "/opt/conda/envs/pytorch/bin/python", "python3")


def cloud_config(host_private: str, host_public: str, user_public: str, max_minutes: int) -> str:
    """User data: the pinned host key, the user's key, and the safety-net shutdown."""
    doc = {
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": host_private, "ed25519_public": host_public},
        "ssh_authorized_keys": [user_public],
        "runcmd": [["shutdown", "-h", f"+{max_minutes}"]],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


class AwsBackend(BackendBase):
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
        self._setup: Optional[dict] = None
        self._bundle: Optional[code_bundle.Bundle] = None
        self.store = open_store(sweep.store_url)
        self.ledger = CostLedger(self.store, self.name_, PriceBook(lambda types, azs: api.spot_prices(self.ec2, types, azs)))

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
                image = api.resolve_image(self.ec2, cfg.image, cfg.image_owner, cfg.region)
                sg = cfg.security_group or api.ensure_security_group(self.ec2, sweep, subnets[0]["VpcId"], cfg.ssh_cidr or api.caller_cidr())
                profile = cfg.instance_profile
                if profile == "create":
                    bucket, _, prefix = self.sweep.store_url[len("s3://"):].partition("/")
                    profile = api.ensure_instance_profile(api.client("iam", cfg.region), sweep, bucket, prefix.strip("/"),
                                                          [e.source for e in self.sweep.spec.data or []])
                public_ip = cfg.ssh.address == "public_ip" and not all(s["MapPublicIpOnLaunch"] for s in subnets)
                data = api.launch_template_data(image, sg, cfg.volume_gb, profile, public_ip)
                template = api.ensure_launch_template(self.ec2, sweep, data)
            except (ClientError, BotoCoreError) as exc:
                raise api.explain(exc, "preparing the sweep's AWS resources") from None
            choices = fleet.choices(cfg.instance_types, subnets)
            self._setup = {"template": template, "base": api.template_data(self.ec2, template), "choices": choices, "image": image, "sg": sg}
        return self._setup

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
            image = api.resolve_image(self.ec2, self.cfg.image, self.cfg.image_owner, self.cfg.region)
        except (ClientError, BotoCoreError) as exc:
            raise api.explain(exc, "reading spot prices and instance types") from None
        rows = [{"type": t, "az": az, "spot_usd_per_h": prices.get((t, az)), "gpus": gpus.get(t)} for t in self.cfg.instance_types for az in azs]
        known = [r["spot_usd_per_h"] for r in rows if r["spot_usd_per_h"] is not None]
        hours = (self.sweep.spec.timeout_minutes or self.cfg.max_minutes) / 60
        cheapest = min(known) if known else None
        return {"choices": rows, "runs": len(self.sweep.runs), "hours_per_run_max": hours, "image": f"{image['ImageId']} ({image['Name']})",
                "estimate_usd_max": round(cheapest * hours * len(self.sweep.runs), 2) if cheapest is not None else None}

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
        self.ledger.observe([i["instance_id"] for i in instances])
        hosts = []
        for i in instances:
            if not i["run"]:
                continue
            attempt = int(i["attempt"]) if i["attempt"].isdigit() else None
            hosts.append(Host(run_id=i["run"], host_id=i["instance_id"], address=self._address(i), attempt=attempt,
                              provisioning=pending.get(i["run"]) == attempt, start_deadline=self._deadline(i, attempt, ready)))
        seen = {h.run_id for h in hosts}
        hosts += [Host(run_id=r, host_id=ACQUIRING, address="", attempt=a, provisioning=True) for r, a in pending.items() if r not in seen]
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
        if host.host_id != ACQUIRING:
            api.terminate(self.ec2, [host.host_id])

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str) -> RunTask:
        cfg = self.cfg
        return contract.new_task(self.sweep, run_id, attempt, command, params_json, contract.REMOTE_BASE,
                                 heartbeat_s=cfg.heartbeat_s, sync_s=cfg.sync_s, host="", terminate_on_exit=not cfg.keep_alive,
                                 imds=True, notice_poll_s=5.0,
                                 idle_s=cfg.idle_minutes * 60 if cfg.keep_alive and cfg.idle_minutes else None)

    def start(self, task: RunTask) -> Host:
        with self.lock:
            if task.run_id in self.pending:
                raise OrchError(f"run {task.run_id} is already being provisioned")
            self.pending[task.run_id] = task.attempt
        self.pool.submit(self._provision, task)
        return Host(run_id=task.run_id, host_id="(acquiring)", address="")

    def stop(self, run_id: str, reason: str) -> bool:
        inst = self._instance_of(run_id)
        if inst is None:
            return False
        try:
            conn = connect(self._target(inst), timeout=20)
            try:
                conn.run(contract.stop_script(self._ctl(run_id), contract.session_name(self.name_, run_id), reason, STOP_WAIT_S,
                                              contract.REMOTE_TMUX_SOCKET), timeout=STOP_WAIT_S + 30)
            finally:
                conn.close()
        except OrchError as exc:
            log.warning("could not stop %s gracefully: %s", run_id, exc)
        api.terminate(self.ec2, [inst["instance_id"]])
        return True

    def attach(self, run_id: str) -> int:
        """An interactive terminal in the run's tmux window: system ssh when there is one, paramiko otherwise."""
        import shutil

        inst = self._instance_of(run_id)
        if inst is None:
            raise OrchError(f"run {run_id} has no running instance. See its log with `orch logs {run_id}`.")
        target = self._target(inst)
        remote = (f"tmux -L {contract.REMOTE_TMUX_SOCKET} attach-session -t "
                  f"{shlex.quote('=' + contract.session_name(self.name_, inst['run']) + ':run')}")
        if shutil.which("ssh") is None:
            return interactive(target, remote)
        argv = attach_argv(target, remote, known_hosts_file(target, orch_home() / "known_hosts"))
        os.execvp(argv[0], argv)
        return 0

    def teardown(self) -> List[str]:
        from ..teardown import teardown

        return teardown(self.ec2, api.client("iam", self.cfg.region), self.name_)

    # --- provisioning (worker threads) ----------------------------------------------------------

    def _provision(self, task: RunTask) -> None:
        """Acquire, boot, check and start one attempt. Once CreateFleet returned an instance, every
        way out of here leaves it either running this attempt's agent or terminated and recorded."""
        instance_id, reported = None, True
        try:
            if self.fatal is not None:
                raise self.fatal
            setup = self.bootstrap()
            if task.replaces:  # that (type, AZ) just took its instance back: try elsewhere first
                self._block_reclaimed(task.replaces)
            host_private, host_public = new_host_key()
            user_data = cloud_config(host_private, host_public, public_key_of(self.cfg.ssh.identity), self.cfg.max_minutes)
            tags = api.sweep_tags(self.name_, run=task.run_id, attempt=str(task.attempt), hostkey=host_public) + [
                {"Key": "Name", "Value": f"orch {self.name_} {task.run_id} #{task.attempt}"}]
            got = fleet.acquire(self.ec2, setup["template"], setup["base"], user_data, setup["choices"], fleet.markets(self.cfg.market),
                                tags, self.blocklist)
            instance_id = got.instance_id
            self.ledger.acquired(got.instance_id, got.instance_type, got.az, got.market)
            log.info("%s: %s %s in %s (%s)", task.run_id, got.instance_id, got.instance_type, got.az, got.market)
            address = api.wait_running(self.ec2, instance_id, self.cfg.ssh.address, self.cfg.boot_timeout_s)
            target = Target(address, self.cfg.ssh.port, self.cfg.ssh.user, self.cfg.ssh.identity, host_public)
            conn = connect(target, timeout=self.cfg.boot_timeout_s, interval=1.0)
            try:
                self._start_agent(conn, task, instance_id)
            finally:
                conn.close()
            reported = False
        except fleet.CapacityUnavailable as exc:
            self._requeue(task, str(exc), instance_id)
        except api.AwsFatal as exc:
            self.fatal = exc  # fail fast: the controller's next pass raises it
            self._requeue(task, str(exc), instance_id)
        except OrchError as exc:  # host key mismatch, sshd never came up, remote command failed
            self._fail(task, str(exc), instance_id)
        except Exception as exc:  # a bug or an unexpected API answer: record it on the run, keep the sweep going
            log.exception("provisioning %s failed", task.run_id)
            self._fail(task, f"provisioning failed: {type(exc).__name__}: {exc}", instance_id)
        finally:
            if not reported:  # else the run stays pending until the controller took the outcome (no window where it looks hostless)
                with self.lock:
                    self.pending.pop(task.run_id, None)

    def _interpreter(self, conn) -> str:
        """The instance's Python for the agent and `{python}`: checked once per controller, on the first host.

        It must import boto3 (the agent) and, when a command runs the bundled trainer, torch. A
        wrong interpreter stops the sweep once, with the fix, instead of failing every run.
        """
        with self._setup_lock:
            if self.python is not None:
                return self.python
            needs = ["boto3"] + (["torch"] if any("-m trainer" in r.command for r in self.sweep.runs) else [])
            candidates = list(PYTHON_CANDIDATES) if self.cfg.python == AUTO_PYTHON else [self.cfg.python]
            probe = " ".join(shlex.quote(c) for c in candidates)
            script = (f'for p in {probe}; do if command -v "$p" >/dev/null 2>&1; then '
                      f'out=$("$p" -c {shlex.quote("import " + ", ".join(needs))} 2>&1) && {{ echo "OK $p"; exit 0; }}; '
                      f'echo "NO $p: $(printf %s "$out" | tail -n 1)"; else echo "NO $p: not found"; fi; done; exit 1')
            r = conn.run(script, timeout=max(300.0, self.cfg.boot_timeout_s))
            found = [line[3:] for line in r.out.splitlines() if line.startswith("OK ")]
            if r.code != 0 or not found:
                tried = "; ".join(line[3:] for line in r.out.splitlines() if line.startswith("NO ")) or r.err.strip()[-300:]
                raise api.AwsFatal(
                    f"no interpreter on the image can run this sweep (it needs {', '.join(needs)}): {tried}. "
                    f"Fix: set `aws.python` to an interpreter of the image that has them (Deep Learning AMI: /opt/pytorch/bin/python), "
                    f"or `auto`; or use an image that has them.")
            self.python = found[0]
            log.info("instance interpreter: %s", self.python)
            return self.python

    def _start_agent(self, conn, task: RunTask, instance_id: str) -> None:
        with self._setup_lock:
            if self._bundle is None:
                self._bundle = code_bundle.build()  # once per controller, not per host
        b = self._bundle
        if conn.run(f'test -f "{b.remote_dir.replace("~/", "$HOME/")}/.complete"').code != 0:
            conn.check(code_bundle.install_command(b), stdin=b.data)
        py = self._interpreter(conn)
        task.host = instance_id
        task.env["ORCH_PYTHON"] = py
        ctl = task.ctl_dir
        task_path = f"{ctl}/task-{task.attempt}.json"
        conn.put_bytes(json.dumps(task.__dict__, indent=2).encode(), task_path)
        agent = contract.agent_command(py, task_path, ctl, pythonpath=b.remote_dir)
        conn.check(f'cd "$HOME" && tmux -L {contract.REMOTE_TMUX_SOCKET} new-session -d -s {shlex.quote(task.session)} '
                   f'-n agent -x 200 -y 50 {shlex.quote(agent)}')
        with self.lock:
            self.ready[task.run_id] = (task.attempt, time.time())

    def _block_reclaimed(self, instance_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            prev = api.instance_placement(self.ec2, instance_id)
        except (ClientError, BotoCoreError):
            return
        if prev:
            self.blocklist.avoid(*prev)
            log.info("avoiding %s in %s for a while: it just reclaimed %s", prev[0], prev[1], instance_id)

    def _release_acquired(self, instance_id: Optional[str]) -> str:
        """Terminate an instance this attempt will not use; say so when even that failed."""
        if not instance_id:
            return ""
        try:
            api.terminate(self.ec2, [instance_id])
            return ""
        except Exception as exc:  # recorded on the run, so `orch down` (which finds it by tag) is the next step
            log.error("could not terminate %s: %s", instance_id, exc)
            return f" (could not terminate {instance_id}: {exc}; `orch down {self.name_}` removes it)"

    def _requeue(self, task: RunTask, reason: str, instance_id: Optional[str] = None) -> None:
        """No host for this attempt (no capacity, or the sweep must stop): the run waits as it was before the claim."""
        self.outcomes.put(Outcome(task.run_id, task.attempt, QUEUED, reason + self._release_acquired(instance_id)))

    def _fail(self, task: RunTask, reason: str, instance_id: Optional[str]) -> None:
        log.warning("%s: %s", task.run_id, reason)
        self.outcomes.put(Outcome(task.run_id, task.attempt, FAILED, reason + self._release_acquired(instance_id)))

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
        for inst in api.sweep_instances(self.ec2, self.name_, ["pending", "running"]):
            if inst["run"] == run_id or inst["instance_id"] == run_id:
                return inst
        return None

    def _target(self, inst: dict) -> Target:
        if not inst.get("host_key"):
            raise OrchError(f"{inst['instance_id']} carries no pinned host key (tag orch:hostkey); refusing to connect.")
        return Target(self._address(inst), self.cfg.ssh.port, self.cfg.ssh.user, self.cfg.ssh.identity, inst["host_key"])

    def run_of_instance(self, instance_id: str) -> Optional[str]:
        inst = self._instance_of(instance_id)
        return inst["run"] if inst else None

