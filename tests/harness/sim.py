"""A simulated cloud, store and command for the harness: what orch's real code is driven through.

Nothing here replaces a function of orch's. The fakes stand where the real world would be:

- `Cloud`: the machines. Instances with a price per hour, slots shared by packed runs, a host per node of
  a run; it remembers when each instance was acquired and when it went (what a bill is made of).
- `SimBackend`: orch's Backend interface over that cloud, as the controller's side of a backend (one per
  controller: a relaunched controller gets a fresh one over the same cloud, as `orch launch` does). It
  keeps the sweep's cost ledger with orch's own `CostLedger` and makes each attempt's task with orch's
  own `new_task`.
- `SimAgent`: one attempt on one host (a node of it). It is orch's `Agent` object, driven step by step: its
  first report and restore as `Agent.run` does them, then the real watch (`watch.checks_for`: exit, rungs,
  superseded, a node failed, the attempt ending, spot notice, stop, syncs) polled once per tick, then its real
  `_final_sync`, a multi-node attempt's end (node 0 tells the followers with `NodesEnd` and records the end
  once each is done; a follower says it is done and waits for node 0's record), and `_finish`. What it does
  not run is the part that needs a process: the tmux window and the command's process group (the
  `WindowGone` and `FindGroup` checks, which look at tmux and /proc); the simulated command writes its
  metrics lines, its log and its exit code file where the wrapper script would.
- `GuardedStore`: orch's folder store behind a switch that makes writes fail (a full disk, a revoked
  role); it also keeps the order in which the study record and status records were written.
"""

from __future__ import annotations

import builtins
import itertools
import json
import math
import shlex
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook
from orchestrator.backends.base import BackendBase, Host
from orchestrator.contract import NOTICE_FILE, SCHEDULED, STOP_REASON_FILE, RunTask
from orchestrator.errors import OrchError
from orchestrator.host import watch
from orchestrator.host.agent import Agent
from orchestrator.host.nodes import FOLLOWER_WAIT_S, FOLLOWERS_DONE_S, FollowerReporter, NodesEnd
from orchestrator.store import layout
from orchestrator.store import lifecycle as life
from orchestrator.store.folder import LocalStore
from orchestrator.store.lifecycle import Impossible, StopReason
from orchestrator.store.status import read_status
from orchestrator.sweep.spec import Sweep
from orchestrator.sweep.tasks import new_task, on_host

_BACKENDS = itertools.count(1)
SWITCH_S = 5.0  # `deadline:`: a move's boot and restore, as the sweep would have measured it (seconds)
PRICES = {"sim.small": 3600.0, "sim.large": 14400.0}  # dollars an hour: $1 and $4 a wall second, so that a budget of
# a few dollars is spent within a scenario that lasts a second or two
UNWATCHABLE = (watch.WindowGone, watch.FindGroup)  # they look at tmux and processes, which a simulated command lacks


class StoreRefused(OSError):
    """The store refuses writes (the harness's fault)."""


class GuardedStore:
    """orch's folder store, with writes refused while `refusing`; remembers the study's and records' writes."""

    def __init__(self, root: Path):
        self.inner = LocalStore(str(root))
        self.refusing = False
        self.writes: list[tuple[str, bytes]] = []  # (key, data) of study and status writes, in order
        self.secret: bytes | None = None  # `notify:`'s sink URL secret: every write is looked at for it
        self.leaked: list[str] = []  # the keys of writes that held it

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _guard(self, key: str = "", data: bytes | None = None) -> None:
        if self.refusing:
            raise StoreRefused(30, "Read-only file system (the harness refuses writes)")
        if data is not None and self.secret is not None and self.secret in data:
            self.leaked.append(key)
        if data is not None and (key.endswith("study.json") or key.endswith("status.json")):
            self.writes.append((key, data))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._guard(key, data)
        self.inner.put_bytes(key, data)

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        self._guard()
        new = self.inner.put_if(key, data, version)
        if new is not None:
            self._guard(key, data)
        return new

    def sync_up(self, *args, **kwargs):
        self._guard()
        return self.inner.sync_up(*args, **kwargs)

    def delete_prefix(self, prefix: str) -> int:
        self._guard()
        return self.inner.delete_prefix(prefix)


@dataclass
class Instance:
    iid: str
    itype: str
    slots: int  # runs it can hold at once (packing); 1: a run's alone
    acquired: tuple[float, float]  # wall time just before and just after the ledger was told
    market: str = "spot"  # `deadline:`: on-demand when the controller's schedule asked for it (buy_on_demand)
    ended: float | None = None  # wall time it was terminated
    occupants: list[str] = field(default_factory=list)  # host ids on it
    seen: list[float] = field(default_factory=list)  # wall times a controller's list() saw it running


@dataclass
class SimHost:
    host_id: str
    run_id: str
    attempt: int
    node: int
    nodes: int
    instance: str
    slot: int
    agent: SimAgent | None = None  # its node's: node 0's reports, the other nodes follow its record


@dataclass
class Received:
    """What one attempt's command was given."""

    run_id: str
    attempt: int
    params_json: dict[str, object]  # ORCH_PARAMS_JSON
    words: dict[str, str]  # `name=value` words of its command line
    lines: int = 0  # metrics lines it wrote (a command stopped before its first line wrote none)
    ended_by: StopReason | str | None = None  # orch's stop that ended it, "vanished" (its host went), None: itself
    node: int = 0  # which node of the attempt (a follower writes no metrics lines, only its log)
    log: Path | None = None  # its log on its host


class Cloud:
    """The world the backends see: instances and hosts, with their bill."""

    def __init__(self, workdir: Path, pack: int, itype: str):
        self.workdir, self.pack, self.itype = workdir, pack, itype
        self.instances: dict[str, Instance] = {}
        self.hosts: dict[str, SimHost] = {}
        self.received: list[Received] = []
        self.now = time.time()  # the harness's clock (the watch's checks are due by it, not by the wall clock)
        self.plans: dict[tuple[str, int], Plan] = {}  # what each attempt's command will do (the harness sets it)
        self.moves: list[tuple[str, int, int]] = []  # orch's own notices: (run, attempt, which controller's backend)
        self._n = 0

    def next_id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}-{self._n:05d}"

    def live_instances(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.ended is None]

    def hosts_of(self, run_id: str) -> list[SimHost]:
        return [h for h in self.hosts.values() if h.run_id == run_id]

    def remove_host(self, host_id: str) -> None:
        host = self.hosts.pop(host_id, None)
        if host is None:
            return
        agent = host.agent
        if agent is not None and agent.phase == SimAgent.RUNNING and agent.received and not agent.received.ended_by:
            agent.received.ended_by = "vanished"
        inst = self.instances[host.instance]
        inst.occupants.remove(host_id)
        if not inst.occupants:
            inst.ended = time.time()  # the agent of its last run terminates it (or the controller released it)

    def notice(self, run_id: str) -> bool:
        """The cloud's spot notice to a run's first agent (the file its agent polls); False without one."""
        agents = [h.agent for h in self.hosts_of(run_id) if h.agent is not None]
        if not agents:
            return False
        (agents[0].agent.ctl / NOTICE_FILE).write_text("chaos\n")
        return True

    def live_commands(self, run_id: str) -> list[int]:
        """Attempts of the run whose command runs now (on any of its nodes)."""
        return sorted(
            {h.attempt for h in self.hosts_of(run_id) if h.agent is not None and h.agent.phase == SimAgent.RUNNING}
        )


@dataclass
class Plan:
    """What an attempt's command does: the metric per line (None: NaN), then its exit code."""

    values: list[float | None]
    exit_code: int = 0


def default_plan(run_id: str, attempt: int, lines: int) -> Plan:
    """A smooth learning curve, different per run (so rungs and trials have something to compare)."""
    base = (sum(map(ord, run_id)) % 17) / 17.0
    return Plan([round(1.0 + base - 0.1 * i, 6) for i in range(lines)])


class SimBackend(BackendBase):
    """The controller's side of the simulated cloud (one per controller, like a real backend object)."""

    name = "sim"
    poll_s = 0.0
    stale_s = 1e9  # time never declares a host lost here: the harness makes hosts vanish instead
    start_timeout_s = 1e9
    releases_interrupted_host = False  # the agent ends its attempt itself after a notice, as locally

    def __init__(self, sweep: Sweep, store, cloud: Cloud, lines: int):
        self.sweep, self.store, self.cloud, self.lines = sweep, store, cloud, lines
        self.on_demand: frozenset[str] = frozenset()  # `deadline:`: runs whose next instance is on-demand
        self.serial = next(_BACKENDS)  # which controller's (a relaunch makes a new one)
        book = PriceBook(lambda types, azs: {(t, a): PRICES[t] for t in types for a in azs})
        self.ledger = CostLedger(store, sweep.spec.name, book)
        self.nodes = sweep.spec.resources.nodes if sweep.spec.resources else 1
        self.seen: dict[str, float] = {}  # instance -> wall time this backend's list() last saw it running

    def list(self) -> builtins.list[Host]:
        now = time.time()
        live = self.cloud.live_instances()
        for inst in live:
            inst.seen.append(now)
            self.seen[inst.iid] = now
        self.ledger.observe([i.iid for i in live])
        return [
            Host(
                run_id=h.run_id,
                host_id=h.host_id,
                address="sim",
                attempt=h.attempt,
                node=h.node,
                nodes=h.nodes,
                slot=h.slot,
            )
            for h in self.cloud.hosts.values()
        ]

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        return new_task(
            self.sweep,
            run_id,
            attempt,
            command,
            params_json,
            str(self.cloud.workdir / f"a{attempt}"),  # each attempt its own host folder, as a new instance has
            heartbeat_s=1.0,
            notice_poll_s=1.0,
            sync_s=3.0,
            host="sim",
            replaces=replaces,
            host_parts=[SCHEDULED],  # a SIGTERM without a stop file is a scheduler's (take_back), as on Slurm
        )

    def start(self, task: RunTask) -> Host:
        if self.cloud.hosts_of(task.run_id):
            raise OrchError(f"run {task.run_id} already has a live host; not starting it twice.")
        first: SimHost | None = None
        market = "on-demand" if task.run_id in self.on_demand else "spot"
        for node in range(self.nodes):
            inst, slot = self._place(market)
            host = SimHost(self.cloud.next_id("h"), task.run_id, task.attempt, node, self.nodes, inst.iid, slot)
            inst.occupants.append(host.host_id)
            self.cloud.hosts[host.host_id] = host
            plan = self.cloud.plans.get((task.run_id, task.attempt)) or default_plan(
                task.run_id, task.attempt, self.lines
            )
            node_task = on_host(task, inst.iid, node, self.nodes, slot=slot) if self.nodes > 1 else task
            if node == 0:
                first = host
            else:  # a host of its own: its own folders; its command runs until node 0's ends (or it fails)
                node_task = replace(
                    node_task, run_dir=f"{task.run_dir}.node{node}", ctl_dir=f"{task.ctl_dir}.node{node}"
                )
                plan = Plan([])
            host.agent = SimAgent(node_task, self.store, plan, self.cloud)
        return Host(run_id=task.run_id, host_id=first.host_id, address="sim", attempt=task.attempt, nodes=self.nodes)

    def _place(self, market: str) -> tuple[Instance, int]:
        """A free slot of a shared instance of the market (packing), else a new instance; the ledger is told as
        AWS's is."""
        if self.cloud.pack > 1 and self.nodes == 1:
            for inst in self.cloud.live_instances():
                if inst.market != market:
                    continue
                taken = {self.cloud.hosts[h].slot for h in inst.occupants}
                free = [s for s in range(inst.slots) if s not in taken]
                if free:
                    return inst, free[0]
        iid = self.cloud.next_id("i")
        before = time.time()
        slots = self.cloud.pack if self.nodes == 1 else 1
        self.ledger.acquired(iid, self.cloud.itype, "sim-1a", market, slots=slots if slots > 1 else 0)
        inst = Instance(iid, self.cloud.itype, slots, (before, time.time()), market=market)
        self.cloud.instances[iid] = inst
        return inst, (0 if slots > 1 else -1)

    def release(self, host: Host) -> None:
        self.cloud.remove_host(host.host_id)

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """The stop protocol as contract.stop_script runs it: the reason in the stop file, SIGTERM to the agent
        (its own handler), then wait for the agent to end (here: tick it until it has)."""
        hosts = self.cloud.hosts_of(run_id)
        agents = [h.agent for h in hosts if h.agent is not None and h.agent.phase != SimAgent.DONE]
        if not hosts:
            return False
        for agent in agents:
            if agent.received is not None and agent.received.ended_by is None:
                agent.received.ended_by = reason
            (agent.agent.ctl / STOP_REASON_FILE).write_text(str(reason))
            self._terminate(agent)
        for host in hosts:  # its session ended: the hosts of the run go
            self.cloud.remove_host(host.host_id)
        return True

    def _terminate(self, agent: SimAgent, signum: int = signal.SIGTERM) -> None:
        """SIGTERM (or `signum`) to the agent (its own handler), then tick it until it has ended."""
        agent.agent._on_signal(signum, None)
        for _ in range(50):
            if agent.phase == SimAgent.DONE:
                break
            self.cloud.now += 0.1
            agent.tick(self.cloud.now, stopping=True)

    def take_back(self, run_id: str, signum: int = signal.SIGTERM) -> list[int]:
        """A scheduler ends the run's job (Slurm: a requeue, a preemption, a node set DOWN): SIGTERM to every node's
        agent with no stop file, each ticked until it ended; then the job's hosts go. The attempts it ended. With
        SIGHUP: the run's tmux session killed with its host (ssh: a machine powered off; local: the session gone)."""
        ended = []
        for host in self.cloud.hosts_of(run_id):
            agent = host.agent
            if agent is not None and agent.phase not in (SimAgent.DONE, SimAgent.BOOTING):
                ended.append(agent.agent.task.attempt)
                if signum == signal.SIGHUP and agent.received is not None and agent.received.ended_by is None:
                    agent.received.ended_by = "vanished"  # its host went with what it had not synced
                self._terminate(agent, signum)
        for host in self.cloud.hosts_of(run_id):
            self.cloud.remove_host(host.host_id)
        return ended

    def notify_interruption(self, run_id: str) -> bool:
        """orch's own notice (a `deadline:` move): recorded per controller, then as the cloud's."""
        agents = [h.agent for h in self.cloud.hosts_of(run_id) if h.agent is not None]
        if agents:
            self.cloud.moves.append((run_id, agents[0].agent.task.attempt, self.serial))
        return self.cloud.notice(run_id)

    def buy_on_demand(self, runs: frozenset[str]) -> None:
        self.on_demand = runs

    def markets(self) -> dict[str, str]:
        return {h.run_id: self.cloud.instances[h.instance].market for h in self.cloud.hosts.values() if h.node == 0}

    def switch_s(self) -> float | None:
        return SWITCH_S

    def attach(self, run_id: str, node: int = 0) -> int:
        raise OrchError("a simulated host has no terminal")

    def spend(self) -> float:
        return self.ledger.spend()

    def flush(self) -> None:
        self.ledger.flush()


class SimAgent:
    """One attempt's agent: orch's Agent, driven a tick at a time (see the module's docstring)."""

    BOOTING, RUNNING, ENDING, AWAITING, DONE = "booting", "running", "ending", "awaiting", "done"

    def __init__(self, task: RunTask, store, plan: Plan, cloud: Cloud):
        self.task, self.plan, self.cloud = task, plan, cloud
        self.agent = Agent(task, store)
        self.agent.ctl.mkdir(parents=True, exist_ok=True)  # the backend put the task file there
        self.phase = self.BOOTING
        self.checks: list[watch.Check] = []
        self.written = 0  # metrics lines the command wrote
        self.received: Received | None = None  # what its command was given, once it started
        self.ran = False  # its command started
        self.follower = task.node_rank > 0
        self.fails = False  # a follower's command exits 7 at its next step (the harness's fault)
        self.code: int | None = None  # its command's exit code, once the watch ended
        self.landed = True  # its final sync landed
        self.ending: NodesEnd | None = None  # node 0 waits for the followers' last syncs
        self.since = 0.0  # when it began to wait (ENDING, AWAITING)
        self.dies_after_end = False  # the harness's fault: it records how the attempt ended, then dies: its host stays

    @property
    def status(self):
        """The agent's record (each transition gives the agent a new one)."""
        return self.agent.status if self.phase != self.BOOTING else None

    def boot(self, now: float) -> None:
        """Agent.run up to its command's start: the first report, the restore, `running`."""
        a, t = self.agent, self.task
        a.ctl.mkdir(parents=True, exist_ok=True)
        for stale in (STOP_REASON_FILE, NOTICE_FILE):
            (a.ctl / stale).unlink(missing_ok=True)
        a.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            a.status = life.start(
                read_status(a.store, t.sweep, t.run_id),
                t.attempt,
                t.host or "localhost",
                "restoring the run folder",
                code=t.code,
            )
        except Impossible:
            self._leave()
            return
        if not a.reporter.record(a.status):
            self._leave()
            return
        a._restore()
        with a.status_lock:
            a.status = life.run(a.status, t.attempt, t.host, now)
            a.reporter.record(a.status)
        self._launch(now)

    def _launch(self, now: float) -> None:
        """What the wrapper script does at the start: the log's header; the command receives its task."""
        a, t = self.agent, self.task
        a.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(a.log_file, "a") as f:
            f.write(f"[orch] attempt {t.attempt} of {t.run_id}: {t.command}\n")
        a.exit_file.unlink(missing_ok=True)
        words = dict(w.split("=", 1) for w in shlex.split(t.command) if "=" in w)
        self.received = Received(
            t.run_id, t.attempt, json.loads(t.env["ORCH_PARAMS_JSON"]), words, node=t.node_rank, log=a.log_file
        )
        self.cloud.received.append(self.received)
        self.checks = [c for c in watch.checks_for(a, now) if not isinstance(c, UNWATCHABLE)]
        self.phase, self.ran = self.RUNNING, True

    def _leave(self) -> None:
        """Its host goes (its instance terminates itself); the other nodes leave by themselves."""
        self.phase = self.DONE
        for h in [h for h in self.cloud.hosts.values() if h.agent is self]:
            self.cloud.remove_host(h.host_id)

    def _command_step(self, stopping: bool) -> None:
        """The command: a line (and its log line) per tick, its exit code after the last; SIGTERM ends it (143)."""
        a = self.agent
        if a.exit_file.exists():
            return
        if a.stop_sent_at is not None or stopping and a.stop_requested is not None:
            with open(a.log_file, "a") as f:  # its SIGTERM handler's last words: only a sync after the stop keeps them
                f.write("stopped (SIGTERM)\n")
            a.exit_file.write_text("143\n")
            return
        if self.follower:  # its log only: the run folder is node 0's
            if self.fails:
                a.exit_file.write_text("7\n")
                return
            with open(a.log_file, "a") as f:
                f.write(f"node {self.task.node_rank} step\n")
            return
        if self.written < len(self.plan.values):
            value = self.plan.values[self.written]
            self.written += 1
            if self.received is not None:
                self.received.lines = self.written
            line = {"epoch": self.written, "step": self.written * 10, "loss": math.nan if value is None else value}
            with open(a.run_dir / layout.METRICS_FILE, "a") as f:
                f.write(json.dumps(line) + "\n")  # NaN as json.dumps writes it, as Python trainers do
            with open(a.log_file, "a") as f:
                f.write(f"epoch {self.written} loss {value}\n")
            return
        a.exit_file.write_text(f"{self.plan.exit_code}\n")

    def tick(self, now: float, stopping: bool = False) -> None:
        """One poll of the agent: the command moves on, a heartbeat, the watch's checks; the end when it says so."""
        if self.phase == self.BOOTING:
            self.boot(now)
            return
        if self.phase in (self.ENDING, self.AWAITING):
            self._wait(now)
            return
        if self.phase != self.RUNNING:
            return
        self._command_step(stopping)
        try:  # noqa: SIM105 (the comment on the except says why it passes)
            self.agent.reporter.beat(self.status, now)
        except Exception:  # the heartbeat thread logs and tries again next period
            pass
        if any(c.tick(now) for c in self.checks):
            self.finish()

    def finish(self) -> None:
        """Agent.run after the watch: the exit code, the final sync; a multi-node attempt's end (node 0 tells the
        followers and waits for them, a follower says it is done and waits for node 0's record); the final record,
        the host's end."""
        a = self.agent
        text = a.exit_file.read_text().strip() if a.exit_file.exists() else ""
        self.code = int(text) if text else None
        self.landed = a._final_sync()
        if self.follower:
            a.done_with_attempt(self.code)
            self.phase, self.since = self.AWAITING, self.cloud.now
            return
        if a.ends_for_every_node():
            self.ending = NodesEnd(a.store, self.task.sweep, self.task.run_id, self.task.attempt, self.task.node_hosts)
            if self.ending.announce():
                self.phase, self.since = self.ENDING, self.cloud.now
                return
        self._end()

    def _wait(self, now: float) -> None:
        """node 0: until every follower is done (nodes.end_attempt); a follower: until node 0's record ends the
        attempt (nodes.await_node0). Heartbeats go on meanwhile."""
        a = self.agent
        if self.phase == self.ENDING:
            try:  # noqa: SIM105 (the comment on the except says why it passes)
                a.reporter.beat(a.status, now)
            except Exception:  # the heartbeat thread logs and tries again next period
                pass
            over = self.ending is not None and self.ending.done() or not a.ends_for_every_node()
            if over or now - self.since > FOLLOWERS_DONE_S:
                self._end()
        elif (
            not isinstance(a.reporter, FollowerReporter)
            or not a.reporter.still_running()
            or now - self.since > FOLLOWER_WAIT_S
        ):
            self._end()

    def _end(self) -> None:
        self.agent._finish(self.code, self.landed)
        if self.dies_after_end:  # nothing on the host ends it now: the controller must (control/ended.py)
            self.phase = self.DONE
            return
        self._leave()
