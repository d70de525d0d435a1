"""Provisioning one attempt on aws (worker threads of the aws backend): acquire its instance — or,
for a run with `resources: nodes: N`, N instances all at once in one AZ and the sweep's cluster
placement group there — wait for each sshd, check its pinned host key, upload the code bundle and
start one agent per node in tmux. Node 0's private address and a free port on it are the run's
rendezvous (ORCH_MASTER_ADDR, ORCH_MASTER_PORT).

Once CreateFleet returned instances, every way out of here leaves them either running this
attempt's agents or terminated and recorded on the run: Provisioner.settle is the one answer to every way
provisioning fails, for packed runs (pack.py) too. What it shares with them is the ProvisioningState (state.py).
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from orchestrator import contract
from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.aws import boot
from orchestrator.backends.aws.cloud import ec2 as api
from orchestrator.backends.aws.cloud import fleet
from orchestrator.backends.aws.cloud.placement import ensure_group
from orchestrator.backends.aws.cloud.userdata import cloud_config
from orchestrator.backends.aws.setup import bootstrap
from orchestrator.backends.aws.state import ProvisioningState
from orchestrator.backends.base import Outcome
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.remote.ssh import Target, authorized_keys, new_host_key
from orchestrator.store.status import FAILED, QUEUED
from orchestrator.sweep.spec import AUTO_PYTHON
from orchestrator.sweep.tasks import on_host

log = logging.getLogger("orch.aws")
T = TypeVar("T")

# Where images keep an interpreter with PyTorch, best first (`aws.python: auto`).
PYTHON_CANDIDATES = ("/opt/pytorch/bin/python", "/opt/conda/envs/pytorch/bin/python", "python3")
QUOTA_LINGER_S = 600.0  # how long a terminated instance of the sweep may still count toward an instance quota
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


class Provisioner:
    """Acquires and starts attempts (worker threads), and settles every way that fails; shares with the Packer only
    the ProvisioningState it is given."""

    def __init__(self, state: ProvisioningState):
        self.state = state

    def provision(self, task: RunTask) -> None:
        """Acquire, boot, check and start one attempt on its node(s)."""
        st, cfg = self.state, self.state.cfg
        ids: list[str] = []
        reported = True
        try:
            if st.fatal is not None:
                raise st.fatal
            bootstrap(st)
            if task.replaces:  # that (type, AZ) just took its instance back: try elsewhere first
                self.block_reclaimed(task.replaces)
            host_private, host_public = new_host_key()  # one key per attempt, pinned by tag (shared by its nodes)
            user_data = cloud_config(host_private, host_public, authorized_keys(cfg.ssh.identity), cfg.max_minutes)
            tags = api.sweep_tags(st.name, run=task.run_id, attempt=str(task.attempt), hostkey=host_public) + [
                {"Key": "Name", "Value": f"orch {st.name} {task.run_id} #{task.attempt}"}
            ]
            task = self._with_rung_tags(task, tags)
            region, got = self.acquire_anywhere(user_data, tags, st.markets_for(task.run_id))
            ec2 = st.part(region).ec2
            got.sort(key=lambda g: g.instance_id)  # node ranks: the order list() sees them in
            ids = [g.instance_id for g in got]
            why = st.work.why(got[0].instance_type, got[0].az)  # aws.choose: how its pool ranked (`orch status`)
            for g in got:
                st.ledger.acquired(
                    g.instance_id,
                    g.instance_type,
                    g.az,
                    g.market,
                    run=task.run_id,
                    gpus=self.gpus_of(g.instance_type),
                    attempt=task.attempt,
                    why=why,
                )
            g = got[0]
            log.info("%s: %s %s in %s (%s)%s", task.run_id, ids, g.instance_type, g.az, g.market, why and f"; {why}")
            addresses = [boot.running_address(ec2, i, cfg.ssh.address, cfg.boot_timeout_s) for i in ids]
            conns = []
            try:
                for i, address in zip(ids, addresses, strict=True):
                    target = Target(address, cfg.ssh.port, cfg.ssh.user, cfg.ssh.identity, host_public)
                    conns.append(boot.ssh_to(ec2, i, target, cfg.boot_timeout_s))
                self.start_agents(conns, task, ids)
            finally:
                for c in conns:
                    c.close()
            reported = False
        except Exception as exc:
            self.settle(task, exc, ids)
        finally:
            if not reported:  # else it stays pending until the controller took the outcome (never looks hostless)
                st.provisioned(task.run_id)

    def acquire_anywhere(self, user_data: str, tags: list[dict], markets: list[str]) -> tuple[str, list]:
        """(region, instances) from the first region, in the sweep's order, that has capacity: a region whose every
        pool answers a capacity error (or its quota) hands over to the next one in the same pass. Raises the first
        region's refusal when none has any."""
        st, cfg = self.state, self.state.cfg

        def attempt(region: str) -> list:
            part = st.part(region)
            setup = bootstrap(st, region)  # ImageNotReady: its image is still being copied there
            args = (
                part.ec2,
                setup["template"],
                setup["base"],
                user_data,
                st.work.weigh(setup["choices"], lambda t, az: st.ledger.prices.price(t, az, "spot")),
                markets,
                tags,
                st.blocklist,
            )
            if st.nodes > 1:
                return fleet.acquire_nodes(
                    *args,
                    count=st.nodes,
                    release=lambda ids, ec2=part.ec2: api.terminate(ec2, ids),
                    group_of=lambda az, p=part: ensure_group(p.ec2, st.name, az, p.groups),
                )
            return [fleet.acquire(*args)]

        region, got = first_region_with_capacity(cfg.regions, attempt)
        for g in got:
            st.where[g.instance_id] = region
        return region, got

    def settle(self, task: RunTask, exc: Exception, ids: list[str]) -> None:
        """The one answer to every way an attempt's provisioning fails (CreateFleet's outcomes first), for single
        and packed runs alike; `ids`: the instances this attempt acquired (released here)."""
        if isinstance(exc, fleet.CapacityUnavailable):  # no pool now: the run waits for the next pass
            self._requeue(task, str(exc), ids)
        elif isinstance(exc, fleet.QuotaReached):
            self._quota_reached(task, exc, ids)
        elif isinstance(exc, api.AwsFatal):  # fail fast: the controller's next pass raises it
            self.state.fatal = exc
            self._requeue(task, str(exc), ids)
        elif isinstance(exc, OrchError):  # host key mismatch, sshd never came up, remote command failed
            self._fail(task, str(exc), ids)
        else:  # a bug or an unexpected API answer: record it on the run, keep the sweep going
            log.error("provisioning %s failed", task.run_id, exc_info=exc)
            self._fail(task, f"provisioning failed: {type(exc).__name__}: {exc}", ids)

    def _quota_reached(self, task: RunTask, exc: OrchError, ids: list[str]) -> None:
        """The run waits while the sweep's own instances may free the quota; else the sweep stops (nothing of its
        own will ever free it). One shutting down still holds it, and a terminated one goes on counting toward the
        limit for a while (EC2 Developer Guide, "Eventual consistency": InstanceLimitExceeded)."""
        st = self.state
        if st.instances(api.NOT_GONE):
            self._requeue(task, f"waiting for quota to free (the sweep's running instances hold it): {exc}", ids)
        elif time.time() - st.ledger.last_seen() < QUOTA_LINGER_S:
            self._requeue(task, f"waiting for quota to free (instances of the sweep ended moments ago): {exc}", ids)
        else:
            st.fatal = exc
            self._requeue(task, str(exc), ids)

    def gpus_of(self, instance_type: str) -> int:
        """GPUs of an instance type (DescribeInstanceTypes, else orch's table), for GPU-hours."""
        st = self.state
        with st.setup_lock:
            if instance_type not in st.gpus:
                try:
                    st.gpus.update(api.gpu_counts(st.ec2, [instance_type]))
                except Exception as exc:  # never loses the instance: GPU-hours then count 0 for it
                    log.warning("GPUs of %s unknown: %s", instance_type, exc)
                    st.gpus[instance_type] = 0
            return st.gpus.get(instance_type, 0)

    def _with_rung_tags(self, task: RunTask, tags: list[dict]) -> RunTask:
        """A `prune:` run alone on its instance signals its rungs by tags (contract.RUNGS_TAG): adds them to `tags`.
        Not on several nodes, nor with `keep_alive` (an instance there outlives its run, so its record is read at
        every pass anyway)."""
        if (
            not task.rungs
            or self.state.nodes > 1
            or self.state.cfg.keep_alive
            or len(task.rungs) > contract.MAX_RUNG_TAGS
        ):
            return task
        keys = list(dict.fromkeys(contract.rung_tag(r) for r in sorted(task.rungs)))  # rungs alike in 6 digits: one
        tags += [{"Key": contract.RUNGS_TAG, "Value": str(len(keys))}] + [{"Key": k, "Value": ""} for k in keys]
        return replace(task, host_parts=[*task.host_parts, contract.RUNG_TAGS])

    def start_agents(
        self, conns: list, task: RunTask, ids: list[str], slot: int = -1, env: dict[str, str] | None = None
    ) -> None:
        """The bundle on every node, then one agent per node; node 0 is the rendezvous. `slot` and `env`: the
        run's place on a shared instance (packing)."""
        st = self.state
        with st.setup_lock:
            if st.bundle is None:
                st.bundle = code_bundle.build()  # once per controller, not per host
        b = st.bundle
        for conn in conns:
            if conn.run(f'test -f "{b.remote_dir.replace("~/", "$HOME/")}/.complete"').code != 0:
                conn.check(code_bundle.install_command(b), stdin=b.data)
        py = self._interpreter(conns[0])
        here = {**(env or {}), "ORCH_PYTHON": py}
        if len(conns) > 1:
            port = conns[0].check(f"{shlex.quote(py)} -c {shlex.quote(FREE_PORT)}").strip()
            master = api.describe(st.ec2_of(ids[0]), ids[0]) or {}
            here.update(ORCH_MASTER_ADDR=master.get("private_ip", ""), ORCH_MASTER_PORT=port)
        for rank in sorted(range(len(conns)), reverse=True):  # followers first: node 0 reports once all are started
            self._start_agent(conns[rank], on_host(task, ids[rank], rank, len(conns), here, slot), py, b)
        st.started(task.run_id, task.attempt)

    @staticmethod
    def _start_agent(conn, task: RunTask, py: str, bundle: code_bundle.Bundle) -> None:
        ctl = task.ctl_dir
        task_path = contract.task_file(ctl, task.attempt)
        conn.put_bytes(task.to_json(), task_path)
        agent = contract.agent_command(py, task_path, ctl, pythonpath=bundle.remote_dir)
        conn.check(
            f'cd "$HOME" && tmux -L {contract.REMOTE_TMUX_SOCKET} new-session -d -s {shlex.quote(task.session)} '
            f"-n agent -x 200 -y 50 {shlex.quote(agent)}"
        )

    def _interpreter(self, conn) -> str:
        """The instance's Python for the agent and `{python}`: checked once per controller, on the first host.

        It must import boto3 (the agent) and, when a command runs the bundled trainer, torch. A
        wrong interpreter stops the sweep once, with the fix, instead of failing every run.
        """
        st, cfg = self.state, self.state.cfg
        with st.setup_lock:
            if st.python is not None:
                return st.python
            needs = ["boto3"] + (["torch"] if any("-m trainer" in r.command for r in st.sweep.runs) else [])
            candidates = list(PYTHON_CANDIDATES) if cfg.python == AUTO_PYTHON else [cfg.python]
            probe = " ".join(shlex.quote(c) for c in candidates)
            script = (
                f'for p in {probe}; do if command -v "$p" >/dev/null 2>&1; then '
                f'out=$("$p" -c {shlex.quote("import " + ", ".join(needs))} 2>&1) && {{ echo "OK $p"; exit 0; }}; '
                f'echo "NO $p: $(printf %s "$out" | tail -n 1)"; else echo "NO $p: not found"; fi; done; exit 1'
            )
            r = conn.run(script, timeout=max(300.0, cfg.boot_timeout_s))
            found = [line[3:] for line in r.out.splitlines() if line.startswith("OK ")]
            if r.code == -1:  # no exit status: the connection went (the instance with it), not the interpreters
                raise OrchError("the connection to the instance was lost while looking for its Python")
            if r.code != 0 or not found:
                tried = (
                    "; ".join(line[3:] for line in r.out.splitlines() if line.startswith("NO ")) or r.err.strip()[-300:]
                )
                raise api.AwsFatal(
                    f"no interpreter on the image can run this sweep (it needs {', '.join(needs)}): {tried}. "
                    "Fix: set `aws.python` to an interpreter of the image that has them (Deep Learning AMI: "
                    "/opt/pytorch/bin/python), "
                    f"or `auto`; or use an image that has them."
                )
            st.python = python = found[0]
            log.info("instance interpreter: %s", python)
            return python

    def block_reclaimed(self, instance_id: str) -> None:
        """The (type, AZ) of the previous attempt's instance just took it back: avoid it for a while."""
        from botocore.exceptions import BotoCoreError, ClientError

        self.state.ledger.reclaimed(instance_id)  # its pool's reclaims per hour (cloud/worth.py)
        try:
            prev = api.instance_placement(self.state.ec2_of(instance_id), instance_id)
        except (ClientError, BotoCoreError):
            return
        if prev:
            self.state.blocklist.avoid(*prev)
            log.info("avoiding %s in %s for a while: it just reclaimed %s", prev[0], prev[1], instance_id)
        region = self.state.where.get(instance_id)
        if region and len(self.state.cfg.regions) > 1:
            self._ask_other_regions_again(region)

    def _ask_other_regions_again(self, region: str) -> None:
        """`region` just took an instance back: capacity moves, so pools that the sweep's other regions refused minutes
        ago (capacity blocks, never `never`) are asked again by this attempt; a refusal blocks them again."""
        st, now = self.state, time.time()
        pools = {
            (c.instance_type, c.subnet_id)
            for r, part in list(st.parts.items())
            if r != region and part.setup
            for c in part.setup["choices"]
        }
        for key, until in list(st.blocklist.until.items()):
            if (key[1], key[2]) in pools and until - now <= fleet.BLOCK_S:
                st.blocklist.until.pop(key, None)

    def _release_acquired(self, ids: list[str]) -> str:
        """Terminate instances this attempt will not use; say so when even that failed."""
        if not ids:
            return ""
        try:
            for ec2 in {id(self.state.ec2_of(i)): self.state.ec2_of(i) for i in ids}.values():
                api.terminate(ec2, [i for i in ids if self.state.ec2_of(i) is ec2])
            return ""
        except Exception as exc:  # recorded on the run, so `orch down` (which finds them by tag) is the next step
            log.error("could not terminate %s: %s", ", ".join(ids), exc)
            return f" (could not terminate {', '.join(ids)}: {exc}; `orch down {self.state.name}` removes them)"

    def _requeue(self, task: RunTask, reason: str, ids: list[str] | None = None) -> None:
        """No host for this attempt (no capacity, or the sweep must stop): the run waits as it was before the claim."""
        self.state.outcomes.put(Outcome(task.run_id, task.attempt, QUEUED, reason + self._release_acquired(ids or [])))

    def _fail(self, task: RunTask, reason: str, ids: list[str]) -> None:
        log.warning("%s: %s", task.run_id, reason)
        self.state.outcomes.put(Outcome(task.run_id, task.attempt, FAILED, reason + self._release_acquired(ids)))


def first_region_with_capacity(regions: list[str], attempt: Callable[[str], T]) -> tuple[str, T]:
    """(region, attempt(region)) for the first region, in the sweep's order, whose attempt is not refused for capacity
    or quota (single runs and shared instances alike): a refused region hands over to the next in the same pass. When
    every region refused: the quota refusal (nothing frees by waiting elsewhere), else every region's reasons."""
    refusals: list[Exception] = []
    for region in regions:
        try:
            return region, attempt(region)
        except (fleet.CapacityUnavailable, fleet.QuotaReached) as exc:
            refusals.append(exc)
            if len(regions) > 1:
                log.info("no capacity in %s (%s); asking the next region", region, exc)
    quota = [e for e in refusals if isinstance(e, fleet.QuotaReached)]
    if len(refusals) > 1 and not quota:
        raise fleet.CapacityUnavailable("; ".join(f"{r}: {e}" for r, e in zip(regions, refusals, strict=False)))
    raise (quota or refusals or [fleet.CapacityUnavailable("no region to ask")])[0]
