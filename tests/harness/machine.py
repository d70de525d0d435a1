"""The harness: Hypothesis's stateful testing over orch's real controller, agent, study, rungs and ledger.

Why Hypothesis's `RuleBasedStateMachine` and not a hand-written simulation loop: the defects this is meant
to find sit where two features and a fault meet (search x seeds, search x NaN, prune x sync, a relaunch in
between), and what makes such a defect fixable is its smallest reproduction. Hypothesis draws the sweep's
shape and an interleaving of steps, checks every invariant after every step, and on a failure shrinks the
steps to a short list it prints as Python calls and keeps in its example database (committed beside this
file), so the same failure is replayed first on every run. Time is simulated where orch takes a clock
(`Controller.step(now)`, the watch's `Check.tick(now)`, `Reporter.beat(status, now)`): each agent tick is one
second; what orch timestamps with the wall clock (a record's transitions, the ledger) keeps the wall
clock, and the ledger's invariants bracket it by the wall times the harness read around each event.

What one scenario is: a sweep drawn from grid or search (random or TPE), seeds, `prune:`, `target:`, a
budget, multi-node shapes and packing; commands whose lines follow a curve and that may crash or write
NaN; and steps: controller passes, agent ticks (each a line of the command, a heartbeat and one poll of
the agent's watch), hosts vanishing, spot notices, the controller killed and relaunched (a fresh
Controller and backend over the same store and cloud), records corrupted, the store refusing writes,
`orch cancel`, `orch down`, and the controller's loop ending as `orch launch` ends it. Half the scenarios have a
`notify:` sink: the session's JSON webhook receiver on loopback (Apprise posts to it, as in the notify unit tests);
the sender is stepped by a rule of its own (`Notifier.send`, a try may be refused), and the loop's end drains it
with the sender's thread, as `Controller.run` does.

KNOWN holds defects being fixed elsewhere (issue 44's items): their checks are off in the random
machine and each has a strict xfail test in tests/harness/test_invariants.py that flips when its fix lands (then
remove the item here and the mark there).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from orchestrator.backends.aws.cloud.pricing import ledger_cost
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import finite
from orchestrator.control import deadline as deadline_view
from orchestrator.control.actions import cancel_run, stop_sweep
from orchestrator.control.code import with_snapshot
from orchestrator.control.collect import PARAM_PREFIX, collect, write_outputs
from orchestrator.control.controller import Controller
from orchestrator.control.decide import DONE, decide
from orchestrator.control.notify import Notifier, resolve
from orchestrator.control.notify_events import Facts, messages_of
from orchestrator.control.state import State
from orchestrator.control.study import Outcome, parse_record, rebuild
from orchestrator.store import layout
from orchestrator.store.base import get_json, read_jsonl
from orchestrator.store.status import (
    CANCELLED,
    CORRUPT,
    FAILED,
    INTERRUPTED,
    LOST,
    PRUNED,
    RUNNING,
    STARTING,
    SUCCEEDED,
    read_status,
)
from orchestrator.sweep.search import resolved_metric, trial_of
from tests.harness.sim import PRICES, Cloud, Plan, SimAgent, SimBackend, default_plan

KNOWN: dict[int, str] = {}
LINES = 4  # metrics lines of a command that runs to its end
# issue 44 item 12: a param named like one of collect's columns (`params:`, so every run has it)
CLASHES = ("state", "attempts", "reason", "elapsed_s", "trial_value", "reached", "best_loss", "cost_usd", "region")
CLASH_VALUE = "given-as-a-param"
# the default events and the opt-in `interrupted`: with it a run's "interrupted" message was once delivered after
# "ended" (a relaunch after the loop ended found a run to do again, its record corrupted); such a sweep now ends
# again, and that end ("ended again (N)") is told after the news (control/notify_events.py: keyed_end)
NOTIFY_EVENTS = ("ended", "failed", "target", "best", "budget", "interrupted", "deadline")
_RECEIVER: list = []  # one JSON webhook receiver for the session (scenarios run one at a time)


def receiver():
    """The session's receiver (tests/unit/control/test_notify.py's `Hook`: Apprise's json:// posts to it), started on
    first use: a server per scenario would cost more than the scenario."""
    if not _RECEIVER:
        from tests.unit.control.test_notify import Hook

        _RECEIVER.append(Hook())
    return _RECEIVER[0]


def told(message: dict) -> str:
    """Which event and subject a delivered message is (its outbox key, read back from what the receiver got): the
    title, and for a new best trial or an interruption the first line of the body (`trial N: …`, `… (N so far) …`)."""
    title = message["title"]
    if title.endswith("new best trial") or title.endswith("interrupted"):
        return title + " | " + message["message"].splitlines()[0].split(":")[0].split(";")[0]
    return title


@dataclasses.dataclass
class Scenario:
    """The sweep's shape, drawn once per scenario."""

    search: str | None  # None: a grid; else the sampler
    points: int  # grid values, or trials
    seeds: int
    max_parallel: int
    max_restarts: int
    prune: bool
    target: bool
    budget: float | None
    nodes: int
    pack: int
    value: str  # search: last | best
    clash: str | None = None  # a param named like one of collect's columns (CLASHES)
    notify: bool = False  # a `notify:` sink: the session's JSON webhook receiver on loopback (NOTIFY_EVENTS)
    deadline: str | None = None  # `deadline:` from the launch (an aws setting: the simulated cloud buys markets)

    def yaml(self) -> dict:
        doc: dict = {
            "name": "h",
            "command": "python train.py lr={lr} seed={seed}",
            "store": "store",
            "seeds": self.seeds,
            "max_parallel": self.max_parallel,
            "max_restarts": self.max_restarts,
            "local": {"workdir": "work", "threads_per_run": 1},
            "workdir": "proj",  # the user's code: edited before every relaunch (every_attempt_runs_the_launched_code)
        }
        if self.search is None:
            doc["grid"] = {"lr": [round(0.1 * (i + 1), 2) for i in range(self.points)]}
        else:
            doc["search"] = {
                "sampler": self.search,
                "trials": self.points,
                "seed": 3,
                "metric": "loss",
                "mode": "min",
                "value": self.value,
                "space": {"lr": {"low": 0.001, "high": 1.0, "log": True}},
            }
        if self.prune:
            doc["prune"] = {"metric": "loss", "mode": "min", "at": "epoch", "rungs": [1, 2], "keep": 0.5, "min_runs": 2}
        if self.target:
            doc["target"] = {"metric": "loss", "value": 0.9}
        if self.nodes > 1:
            doc["resources"] = {"nodes": self.nodes}
        if self.clash is not None:
            doc["params"] = {self.clash: CLASH_VALUE}
        if self.notify:
            doc["notify"] = [{"url": receiver().url, "events": list(NOTIFY_EVENTS)}]
        return doc


@st.composite
def scenarios(draw) -> Scenario:
    search = draw(st.sampled_from([None, "random", "tpe"]))
    points = draw(st.integers(1, 3))
    seeds = draw(st.integers(1, 2))
    prune = points * seeds >= 2 and draw(st.booleans())
    # a post per message takes wall time, and the budget's spend is billed by the wall clock: with both, a replay
    # could stop at another budget decision (Hypothesis: FlakyStrategyDefinition)
    notify = draw(st.booleans())
    return Scenario(
        search=search,
        points=points,
        seeds=seeds,
        max_parallel=draw(st.integers(1, 3)),
        max_restarts=draw(st.integers(0, 1)),
        prune=prune,
        target=draw(st.booleans()),
        budget=None if notify else draw(st.one_of(st.none(), st.floats(0.5, 20.0))),
        nodes=draw(st.sampled_from([1, 1, 2])),
        pack=draw(st.sampled_from([1, 1, 2])),
        value=draw(st.sampled_from(["last", "best"])),
        clash=draw(st.sampled_from([None, None, None, *CLASHES])),
        notify=notify,  # each message a post to the session's receiver on loopback
        # impossible from the start (every run moves to on-demand), tight (a switch moment within the scenario), easy
        deadline=draw(st.sampled_from([None, None, "20s", "2m", "30m"])),
    )


PLANS = st.sampled_from(["ok", "ok", "crash", "nan_last", "nan_mid", "burst"])


def plan_of(kind: str, run_id: str, attempt: int) -> Plan:
    plan = default_plan(run_id, attempt, LINES)
    if kind == "crash":
        return Plan(plan.values[:2], exit_code=1)
    if kind == "nan_last":
        return Plan(plan.values[:-1] + [None])
    if kind == "nan_mid":
        return Plan(plan.values[:1] + [None] + plan.values[2:])
    return plan


class Harness(RuleBasedStateMachine):
    """One scenario: a sweep, its cloud, its store, its controller (or none), and what was observed so far."""

    # checks of issue 44's items that are on (fixed on main; a KNOWN one is turned on by its xfail test)
    checked: set[int] = {9, 10, 13}
    counts = {"scenarios": 0, "steps": 0}  # for the figure of scenarios a minute (README: Tests)

    def __init__(self):
        super().__init__()
        self.counts["scenarios"] += 1
        self.root = Path(tempfile.mkdtemp(prefix="orch-harness-"))
        self.controller: Controller | None = None
        self.backend: SimBackend | None = None
        self.clock = time.time()
        self.down = False
        self.progress = None
        self.finals: dict[str, tuple] = {}  # run -> (state, attempt) once final
        self.told: dict[int, tuple] = {}  # trial -> (outcome, value) once told
        self.study_writes = 0  # of store.writes, those already checked
        self.latest: dict[str, dict] = {}  # run -> its newest status record written (from the store's writes)
        self.corrupted: set[str] = set()
        self.sampler_checked: bytes | None = None  # the study record last checked against what its sampler sees
        self.results_checked = 0  # runs.csv/runs.json written and checked (with a param named like a column)
        self.heard_from = 0  # `notify:`: the receiver's messages before this scenario's (scenarios run one at a time)

    # --- the scenario -----------------------------------------------------------------------------

    @initialize(scenario=scenarios(), kinds=st.lists(PLANS, min_size=12, max_size=12))
    def setup(self, scenario: Scenario, kinds: list[str]) -> None:
        from tests.harness.sim import GuardedStore

        self.scenario = scenario
        path = self.root / "sweep.yaml"
        path.write_text(yaml.safe_dump(scenario.yaml()))
        (self.root / "proj").mkdir()
        (self.root / "proj" / "train.py").write_text("# version 0\n")
        sweep = with_snapshot(load_sweep(path))
        self.launched_code = sweep.snapshot.digest if sweep.snapshot else ""
        if scenario.budget is not None:  # a budget is an aws setting; the simulated cloud bills like aws
            sweep = dataclasses.replace(sweep, spec=sweep.spec.model_copy(update={"budget_usd": scenario.budget}))
        if scenario.deadline is not None:  # assumed 60 s a run until one finished with a clock of its own
            over = {"deadline": scenario.deadline, "timeout_minutes": 1.0}
            sweep = dataclasses.replace(sweep, spec=sweep.spec.model_copy(update=over))
        self.sweep = sweep
        self.store = GuardedStore(Path(sweep.store_url))
        if scenario.notify:
            from tests.unit.control.test_notify import SECRET

            self.store.secret = SECRET.encode()
            with receiver().lock:
                self.heard_from = len(receiver().got)
        self.cloud = Cloud(self.root / "hosts", scenario.pack, "sim.large" if scenario.pack > 1 else "sim.small")
        for i, run in enumerate(sweep.runs):
            for attempt in (1, 2, 3):
                kind = kinds[(i * 3 + attempt) % len(kinds)]
                self.cloud.plans[(run.run_id, attempt)] = plan_of(kind, run.run_id, attempt)
        self.bursts = {run.run_id for i, run in enumerate(sweep.runs) if kinds[i % len(kinds)] == "burst"}
        self.state = State(self.root / "home")
        self._launch()

    def _launch(self) -> None:
        if getattr(self, "backend", None) is not None:  # a relaunch, after the user edited the code: as `orch launch`
            # loads it, a new Sweep with the snapshot taken now (a background controller's has none)
            edits = self.root / "proj" / "train.py"
            edits.write_text(edits.read_text() + "# edited\n")
            self.sweep = with_snapshot(dataclasses.replace(self.sweep, code={}, snapshot=None))
        self.backend = SimBackend(self.sweep, self.store, self.cloud, LINES)
        self.controller = Controller(self.sweep, self.backend, self.store, self.state)
        self.controller.prepare()
        self.controller.notify_hand_off = False  # (`loop_ends`: no background sender outlives the scenario)
        # a host left by an agent that died after its run's end is released 2 s (of the harness's clock) after a pass
        # first saw it; at the loop's end, where `Controller.run` waits on the wall clock, 0.2 s
        self.controller.ended.grace_s, self.controller.ended.poll_s = 2.0, 0.01
        if self.sweep.spec.notify:  # as `Controller.run` makes it, without its thread: `notifier_sends` steps it
            self.controller.notifier = Notifier(self.store, "h", resolve(self.sweep.spec.notify))

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # --- steps --------------------------------------------------------------------------------
    # Every step ends with the sweep moving on (`_advance`: a controller pass, relaunching one that died, and a
    # tick of every agent): Hypothesis's swarm testing leaves some rules out of a scenario, and a scenario whose
    # controller never passed would check nothing.

    def _advance(self) -> None:
        if self.store.refusing:
            return
        if self.controller is None:
            self.down = False
            self._launch()
        self.controller_pass()
        self._tick(1)

    def _tick(self, ticks: int) -> None:
        for _ in range(ticks):
            self.clock = max(self.clock, self.cloud.now) + 1.0
            self.cloud.now = self.clock
            for host in sorted(self.cloud.hosts.values(), key=lambda h: h.host_id):
                agent = host.agent
                if agent is not None and agent.phase != SimAgent.DONE and host.host_id in self.cloud.hosts:
                    agent.tick(self.clock)
                    if host.run_id in self.bursts and agent.phase == SimAgent.RUNNING:
                        agent.tick(self.clock)  # two lines in one beat: a burst past several rungs

    @precondition(lambda self: self.controller is not None)
    @rule()
    def controller_pass(self) -> None:
        try:
            self.progress = self.controller.step(now=self.clock)
        except OSError:  # the store refused: `Controller.run` ends so, with the fix to run again
            self.controller = None

    @rule(ticks=st.integers(1, 3))
    def agents_tick(self, ticks: int) -> None:
        self._tick(ticks)
        self._advance()

    @precondition(lambda self: self.cloud.hosts)
    @rule(data=st.data(), whole=st.booleans())
    def host_vanishes(self, data, whole: bool) -> None:
        """A spot reclaim without a notice (or a node of a multi-node attempt lost): no agent ends anything."""
        host = data.draw(st.sampled_from(sorted(self.cloud.hosts)))
        run = self.cloud.hosts[host].run_id
        for h in self.cloud.hosts_of(run) if whole else [self.cloud.hosts[host]]:
            self.cloud.remove_host(h.host_id)
        self._advance()

    @precondition(lambda self: self._running_followers())
    @rule(data=st.data())
    def node_fails(self, data) -> None:
        """A follower's command of a multi-node attempt exits 7: the attempt fails on every node."""
        host = data.draw(st.sampled_from(self._running_followers()))
        host.agent.fails = True
        self._advance()

    @precondition(lambda self: self._running_agents())
    @rule(data=st.data())
    def agent_dies_after_its_end(self, data) -> None:
        """A run's agent will record how its attempt ended and die before it ends its host (on AWS: an instance that
        bills until the safety net): the controller ends that host (control/ended.py)."""
        host = data.draw(st.sampled_from(self._running_agents()))
        host.agent.dies_after_end = True
        self._advance()

    def die_after_end(self, run: str) -> None:
        """RUN's agents record how the attempt ended, then die (a step of scripted scenarios)."""
        for host in self.cloud.hosts_of(run):
            if host.agent is not None:
                host.agent.dies_after_end = True
        self._advance()

    def _running_agents(self) -> list:
        hosts = sorted(self.cloud.hosts.values(), key=lambda h: h.host_id) if hasattr(self, "cloud") else []
        return [h for h in hosts if h.agent and h.agent.phase == SimAgent.RUNNING and not h.agent.dies_after_end]

    def _hosted_run(self, data) -> str:
        """One of the runs that have a host now, drawn."""
        return data.draw(st.sampled_from(sorted({h.run_id for h in self.cloud.hosts.values()})))

    def _failing(self, run: str) -> bool:
        """Whether a node of the run's attempt was made to fail (node_fails) and the failure may not be recorded yet:
        an end that comes with it is the command's failure, not the scheduler's or the host's doing."""
        return any(h.agent is not None and h.agent.fails for h in self.cloud.hosts_of(run))

    def _running_followers(self) -> list:
        hosts = sorted(self.cloud.hosts.values(), key=lambda h: h.host_id) if hasattr(self, "cloud") else []
        return [h for h in hosts if h.agent and h.agent.follower and h.agent.phase == SimAgent.RUNNING]

    def fail_node(self, run: str) -> None:
        """RUN's followers' commands exit 7 (a step of scripted scenarios)."""
        for host in self._running_followers():
            host.agent.fails = host.agent.fails or host.run_id == run
        self._advance()

    def vanish_node(self, run: str, node: int) -> None:
        """The host of RUN's node NODE goes without a word (a step of scripted scenarios)."""
        for host in self.cloud.hosts_of(run):
            if host.node == node:
                self.cloud.remove_host(host.host_id)
        self._advance()

    @precondition(lambda self: self.backend is not None and self.cloud.hosts)
    @rule(data=st.data())
    def spot_notice(self, data) -> None:
        run = self._hosted_run(data)
        self.cloud.notice(run)  # the cloud's, not orch's own (a `deadline:` move: backend.notify_interruption)
        self._advance()

    @precondition(lambda self: self.backend is not None and self.cloud.hosts)
    @rule(data=st.data())
    def scheduler_takes_back(self, data) -> None:
        """A scheduler ends a run's job (Slurm: a requeue, a preemption, a node set DOWN): its agents get SIGTERM
        and no stop file. The attempt ends interrupted (resumable), never as a failure of the command."""
        self.take_back(self._hosted_run(data))

    def take_back(self, run: str) -> None:
        """The scheduler ends RUN's job (the rule above; a step of scripted scenarios)."""
        assert self.backend is not None
        before, failing = read_status(self.store, self.sweep.spec.name, run), self._failing(run)
        ended = self.backend.take_back(run)
        after = read_status(self.store, self.sweep.spec.name, run)
        if before.attempt in ended and before.state in (STARTING, RUNNING) and not failing:
            assert after.failures == before.failures, (before, after)
            assert after.attempt != before.attempt or after.state in (INTERRUPTED, SUCCEEDED, PRUNED), (before, after)
        self._advance()

    @precondition(lambda self: self.backend is not None and self.cloud.hosts)
    @rule(data=st.data())
    def session_hangs_up(self, data) -> None:
        """The ssh (and local) backend's own end of a run (see hang_up)."""
        self.hang_up(self._hosted_run(data))

    def hang_up(self, run: str) -> None:
        """RUN's tmux sessions end with their hosts (a step of scripted scenarios): ssh, a machine powered off or its
        sshd gone; local, the session killed. SIGHUP to the agents, no stop file. The attempt ends lost — it counts
        toward the quick losses that end a run whose host dies at every attempt — never `stopped` (which resets that
        count) and never a failure of the command."""
        assert self.backend is not None
        before, failing = read_status(self.store, self.sweep.spec.name, run), self._failing(run)
        ended = self.backend.take_back(run, signal.SIGHUP)
        after = read_status(self.store, self.sweep.spec.name, run)
        if before.attempt in ended and before.state in (STARTING, RUNNING) and not failing:
            assert after.failures == before.failures, (before, after)
            assert after.state in (LOST, SUCCEEDED, PRUNED), (before, after)
        self._advance()

    @precondition(lambda self: self.controller is not None)
    @rule()
    def kill_controller(self) -> None:
        """SIGKILL: no flush, no goodbye; then a fresh controller (`orch launch` again)."""
        self.controller = None
        self._advance()

    @precondition(lambda self: self.controller is not None and self.controller.notifier is not None)
    @rule(tries=st.integers(1, 4), refused=st.sampled_from([False, False, True]))
    def notifier_sends(self, tries: int, refused: bool) -> None:
        """The sender thread's steps: a few messages of the outbox, each one try to the sink, recorded in the store
        (not while the store refuses writes: a message delivered and not recorded is the duplicate notify.py names).
        `refused`: the receiver answers 503 to these tries (it is up again for the next step)."""
        if not self.store.refusing:
            receiver().down = refused
            try:
                for _ in range(tries):
                    pair = self.controller.notifier.due(math.inf)  # (now: past the backoff of a refused try)
                    if pair is None:
                        break
                    self.controller.notifier.send(pair)
            finally:
                receiver().down = False
        self._advance()

    @rule(ticks=st.integers(0, 2))
    def store_refuses_writes(self, ticks: int) -> None:
        """The store refuses writes for a while: the controller's pass fails (its loop ends, as `Controller.run`
        ends it), agents' heartbeats fail and are tried again; then it takes writes again."""
        self.store.refusing = True
        if self.controller is not None:
            self.controller_pass()
        for _ in range(ticks):
            self.clock += 1.0
            for host in list(self.cloud.hosts.values()):
                if host.agent is not None and host.agent.phase == SimAgent.RUNNING:
                    try:  # noqa: SIM105 (the comment on the except says why it passes)
                        host.agent.agent.reporter.beat(host.agent.status, self.clock)
                    except OSError:
                        pass  # the heartbeat thread logs it and beats again
        self.store.refusing = False
        self._advance()

    @rule(data=st.data(), what=st.sampled_from(["status", "summary"]))
    def corrupt_record(self, data, what: str) -> None:
        if what == "summary":
            self.store.inner.put_bytes(layout.summary_key("h"), b'{"runs": [1, 2')
            self._advance()
            return
        run = data.draw(st.sampled_from([r.run_id for r in self.sweep.runs]))
        self.corrupted.add(run)
        self.store.inner.put_bytes(layout.status_key("h", run), b"{not json")  # by someone else: not a write of orch's
        self._advance()

    @rule(data=st.data())
    def cancel(self, data) -> None:
        self.cancel_one(data.draw(st.sampled_from([r.run_id for r in self.sweep.runs])))

    def cancel_one(self, run: str) -> None:
        """`orch cancel RUN` (a step of scripted scenarios)."""
        cancel_run(self.sweep, SimBackend(self.sweep, self.store, self.cloud, LINES), self.store, run)
        self._advance()

    @rule()
    def orch_down(self) -> None:
        """`orch down`: the controller first (its loop ends: SIGTERM, its ledger flushed), then every live run."""
        if self.controller is not None:
            self.controller._flush()
            self._check_ledger_flushed()
            self.controller = None
        backend = SimBackend(self.sweep, self.store, self.cloud, LINES)
        stop_sweep(self.sweep, backend, self.store)
        backend.teardown()
        self.down = True
        self._check_results_files()

    @precondition(lambda self: self.controller is not None)
    @rule()
    def loop_ends(self) -> None:
        """Every run is final: `Controller.run` makes its last pass and ends (what `orch launch` waits for)."""
        if self.store.refusing or not self.controller.step(now=self.clock).done:
            return  # (something changed since the pass that saw every run final)
        final = self.controller.run(interval=0.001)
        self._check_no_ended_host_left()
        self._check_ledger_flushed()
        self._check_every_event_delivered(final)
        self.controller = None
        self._check_results_files()

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def one_live_attempt_per_run(self) -> None:
        self.counts["steps"] += 1
        for run in self.sweep.runs if hasattr(self, "sweep") else []:
            live = self.cloud.live_commands(run.run_id)
            assert len(live) <= 1, f"{run.run_id} has commands of attempts {live} running at once"

    @invariant()
    def deadline_moves_once_per_attempt_and_shown_as_it_reads_back(self) -> None:
        """`deadline:` — a controller tells a run to move at most once per attempt; what a pass shows is finite and
        reads back from its published form (summary.json); no on-demand instance without a deadline."""
        if not hasattr(self, "cloud"):
            return
        told = Counter(self.cloud.moves)
        assert all(n == 1 for n in told.values()), f"told to move more than once: {told}"
        if self.scenario.deadline is None:
            od = [i.iid for i in self.cloud.instances.values() if i.market != "spot"]
            assert not od and not told, f"without a deadline: on-demand {od}, moves {told}"
            return
        view = self.progress.deadline if self.progress is not None else None
        if view is not None:
            assert deadline_view.read(dataclasses.asdict(view)) == view, view
            assert view.work_left_s >= 0 and view.on_demand_runs <= len(self.sweep.runs), view

    def _check_no_ended_host_left(self) -> None:
        """When the loop returns (`orch launch` ends), no host is left of a run whose agent recorded its end: its
        agent ended it, or the controller did (an agent that died after the end, `agent_dies_after_its_end`)."""
        left = []
        for host in self.cloud.hosts.values():
            status = read_status(self.store, self.sweep.spec.name, host.run_id)
            if status.state in (SUCCEEDED, FAILED) and status.exit_code is not None:
                left.append((host.run_id, host.host_id))
        assert not left, f"hosts of runs their agents ended still run after the loop returned: {left}"

    @invariant()
    def nothing_bills_after_down(self) -> None:
        if getattr(self, "down", False):
            live = self.cloud.live_instances()
            assert not live, f"after `orch down`, instances still run: {[i.iid for i in live]}"

    @invariant()
    def notified_once_each_and_nothing_after_ended(self) -> None:
        """`notify:`: each event is delivered at most once per sink (a controller killed and launched again included:
        the outbox record says what was delivered), what the record says was delivered was received, `ended` is the
        last message, and the sink's URL is never written to the store."""
        if not getattr(self, "scenario", None) or not self.scenario.notify:
            return
        assert not self.store.leaked, f"the notify sink's URL was written to the store: {self.store.leaked}"
        with receiver().lock:
            got = [told(m) for m in receiver().got[self.heard_from :]]
        record = get_json(self.store.inner, layout.notify_key("h")) or {"messages": {}}  # as stored, not through orch
        recorded = {told({"title": m["title"], "message": m["body"]}) for m in record["messages"].values()
                    if m["to"] and None not in m["to"].values()}  # fmt: skip
        assert recorded <= set(got), f"the outbox record says delivered, the receiver never got: {recorded - set(got)}"
        twice = sorted({key for key in got if got.count(key) > 1})
        assert not twice, f"delivered more than once: {twice} (in the order delivered: {got})"
        ends = [i for i, key in enumerate(got) if ": ended" in key]
        assert len({got[i] for i in ends}) == len(ends), f"an end told twice under one title: {got}"

    def _check_every_event_delivered(self, final) -> None:
        """The loop ended (`Controller.run` waits for the sender): every message the outbox queued was delivered,
        and every event the final progress shows (`ended` among them) is one of them."""
        if not self.scenario.notify:
            return
        record = get_json(self.store, layout.notify_key("h")) or {"messages": {}}  # read as stored, not through orch
        pending = [k for k, m in record["messages"].items() if None in m["to"].values()]
        assert not pending, f"the loop ended with messages the outbox record holds as pending: {pending}"
        with receiver().lock:
            got = {told(m) for m in receiver().got[self.heard_from :]}
        wanted = {told({"title": m.title, "message": m.body}) for m in messages_of(final, Facts())
                  if m.event.value in NOTIFY_EVENTS}  # fmt: skip
        assert wanted <= got, f"events never delivered: {sorted(wanted - got)}"
        queued = {told({"title": m["title"], "message": m["body"]}) for m in record["messages"].values()}
        assert queued <= got, f"queued and recorded as delivered, never received: {sorted(queued - got)}"
        with receiver().lock:
            order = [told(m) for m in receiver().got[self.heard_from :]]
        ends = [i for i, key in enumerate(order) if ": ended" in key]
        assert not ends or ends[-1] == len(order) - 1, f"delivered after the last end: {order[ends[-1] + 1 :]}"

    @invariant()
    def every_attempt_runs_the_launched_code(self) -> None:
        """`workdir:`: the snapshot the first launch took is the one every attempt of every run runs, whatever was
        edited before a relaunch (control/code.py): a run never mixes two versions."""
        for run in self.sweep.runs if hasattr(self, "sweep") else []:
            if self.store.refusing or run.run_id in self.corrupted:
                continue
            status = read_status(self.store, "h", run.run_id)
            if status.state in (RUNNING, SUCCEEDED):
                assert status.code == self.launched_code, f"{run.run_id} ran code {status.code!r}"

    @invariant()
    def final_records_stay_final(self) -> None:
        for run in self.sweep.runs if hasattr(self, "sweep") else []:
            if self.store.refusing or run.run_id in self.corrupted:
                continue
            status = read_status(self.store, "h", run.run_id)
            before = self.finals.get(run.run_id)
            if before is not None:
                assert (status.state, status.attempt) == before, (
                    f"{run.run_id} was final {before} and is now {(status.state, status.attempt)}"
                )
            elif status.state in (SUCCEEDED, CANCELLED, PRUNED):
                self.finals[run.run_id] = (status.state, status.attempt)

    @invariant()
    def final_runs_are_in_the_store(self) -> None:
        """Every final run whose command ran has its metrics file and its last attempt's log in the store: every line
        the command wrote on each node of it, the run's metrics lines too on node 0, however the attempt ended (a
        stop of orch's, a failed node, a node gone) — unless that node's own host went with what it had not synced."""
        if not hasattr(self, "sweep"):
            return
        for run in self.sweep.runs:
            if run.run_id in self.corrupted:
                continue  # (checked at once, hosts or not: every node's log is in the store before the end is recorded)
            status = read_status(self.store, "h", run.run_id)
            if status.state not in (SUCCEEDED, PRUNED, CANCELLED, FAILED):
                continue
            if status.state in (PRUNED, CANCELLED) and 10 not in self.checked:
                continue
            ran = [r for r in self.cloud.received if r.run_id == run.run_id and r.attempt == status.attempt]
            if not any(r.node == 0 for r in ran):
                continue  # the last attempt never ran its command (e.g. a claim cancelled)
            for r in ran:
                if r.ended_by == "vanished":
                    continue  # (its host went: what it wrote since its last sync went with it)
                self._check_kept(r, status)

    def _check_kept(self, r, status) -> None:
        stored = self.store.get_bytes(layout.log_key("h", r.run_id, r.attempt, r.node)) or b""
        wrote = r.log.read_bytes() if r.log is not None else b""
        assert stored == wrote, (
            f"{r.run_id} ended {status.state}: node {r.node} of attempt {r.attempt} wrote {len(wrote.splitlines())} "
            f"log lines, the store has {len(stored.splitlines())}"
        )
        if r.node == 0:
            metrics = read_jsonl(self.store.get_bytes(layout.metrics_key("h", r.run_id)))
            # (the run folder holds earlier attempts' lines too, restored from the store)
            assert len(metrics) >= r.lines, (
                f"{r.run_id} ended {status.state}: its last attempt's command wrote {r.lines} metrics lines, "
                f"the store has {len(metrics)}"
            )

    @invariant()
    def results_show_what_commands_received(self) -> None:
        if not hasattr(self, "sweep") or not self.cloud.received:
            return
        results = {r.run_id: r for r in collect(self.sweep, self.store).runs}
        got: dict[str, dict] = {}
        for received in self.cloud.received:
            before = got.setdefault(received.run_id, received.params_json)
            assert before == received.params_json, (
                f"{received.run_id}: attempt {received.attempt} got params {received.params_json}, an earlier one "
                f"{before}"
            )
            params = results[received.run_id].params
            assert params == received.params_json, (
                f"{received.run_id}: collect shows {params}, its command received {received.params_json}"
            )
            shown = {k: str(v) for k, v in params.items() if k in received.words}
            assert shown == {k: received.words[k] for k in shown}, (
                f"{received.run_id}: collect shows {params}, its command line had {received.words}"
            )

    def _check_results_files(self) -> None:
        """`orch collect`'s runs.csv and runs.json, once the loop ended or the sweep was stopped: a param named like one
        of collect's columns is under `param.<name>` and the column says what collect says, never the param's value
        (issue 44 item 12; written only then, and only with such a param)."""
        if self.scenario.clash is None or self.store.refusing:
            return
        self.results_checked += 1
        results = collect(self.sweep, self.store)
        out = self.root / "collected"
        write_outputs(results, out, draw=False)  # the tables alone: drawing curves.png took 3/4 of the harness's time
        with open(out / "runs.csv", newline="") as f:
            in_csv = {row["run_id"]: row for row in csv.DictReader(f)}
        in_json = {row["run_id"]: row for row in json.loads((out / "runs.json").read_text())["runs"]}
        name = self.scenario.clash
        for r in results.runs:
            for where, row in (("runs.csv", in_csv[r.run_id]), ("runs.json", in_json[r.run_id])):
                assert row.get(PARAM_PREFIX + name) == CLASH_VALUE, (
                    f"{where}: the param {name!r} of {r.run_id} is not under {PARAM_PREFIX}{name}: {row}"
                )
                assert str(row.get(name)) != CLASH_VALUE, f"{where}: the param {name!r} overwrote the column: {row}"
                assert (str(row["state"]), str(row["attempts"])) == (r.state, str(r.attempts)), (
                    f"{where}: {r.run_id} shows state {row['state']} attempts {row['attempts']}, collect has "
                    f"{r.state} {r.attempts}"
                )

    @invariant()
    def trials_told_once_by_the_rule(self) -> None:
        if not hasattr(self, "sweep") or self.sweep.spec.search is None:
            return
        data = self.store.get_bytes(layout.study_key("h"))
        if data is None:
            return
        record = parse_record(data, layout.study_key("h"), self.sweep.spec.search)
        if data != self.sampler_checked:
            self._check_sampler_sees_the_record(record)
            self.sampler_checked = data
        for trial in record.trials:
            if trial.outcome is Outcome.ASKED:
                assert trial.number not in self.told, f"trial {trial.number} was told, and is now asked again"
                continue
            now = (trial.outcome, trial.value)
            if trial.number in self.told:
                assert self.told[trial.number] == now, (
                    f"trial {trial.number} told {self.told[trial.number]}, then {now}"
                )
                continue
            self.told[trial.number] = now
            self._check_rule(trial)
        self._check_study_writes()

    def _check_rule(self, trial) -> None:
        """README "Search": the mean over its seeds of each run's value (the metric on its last line that has it,
        or its best), FAIL when a run failed or has no finite value (a NaN last value included), PRUNED when
        `prune:` stopped it; told once all its runs are final."""
        runs = [r.run_id for r in self.sweep.runs if trial_of(r.run_id) == trial.number]
        statuses = [read_status(self.store, "h", rid) for rid in runs]
        if any(s.state == CORRUPT for s in statuses):
            return  # (the harness corrupted one: what its run ended as cannot be read now)
        spec = self.sweep.spec
        for s in statuses:
            final = decide(s, None, spec.max_restarts, self.clock, 1e9, 1e9) == DONE
            assert final or s.run_id in self.corrupted, (
                f"trial {trial.number} told {trial.outcome.value} while {s.run_id} is {s.state}"
            )
        if any(s.state == PRUNED for s in statuses):
            assert trial.outcome is Outcome.PRUNED, f"trial {trial.number} has a pruned run, told {trial.outcome}"
            return
        values = []
        for s in statuses:
            lines = read_jsonl(self.store.get_bytes(layout.metrics_key("h", s.run_id)))
            with_metric = [line["loss"] for line in lines if "loss" in line]
            if self.sweep.spec.search.value == "last":
                if with_metric and finite(with_metric[-1]) is None and 13 not in self.checked:
                    return  # KNOWN 13
                value = finite(with_metric[-1]) if with_metric else None
            else:
                finite_values = [v for v in map(finite, with_metric) if v is not None]
                value = min(finite_values) if finite_values else None
            values.append(value if s.state == SUCCEEDED else None)
        if values and None not in values:
            expected = sum(values) / len(values)
            assert trial.outcome is Outcome.COMPLETE and math.isclose(trial.value, expected), (
                f"trial {trial.number}: told {trial.outcome.value} {trial.value}, the rule says COMPLETE {expected}"
            )
        else:
            assert trial.outcome is Outcome.FAIL, (
                f"trial {trial.number}: told {trial.outcome.value}, the rule says FAIL"
            )

    def _check_sampler_sees_the_record(self, record) -> None:
        """README "Search": what the sampler is told of each trial is what the record says (a pruned trial PRUNED with
        its values at the rungs, never COMPLETE), and TPE with several trials at once lies about the running ones."""
        import optuna

        spec = self.sweep.spec
        study, sampler = rebuild(record, spec.search, resolved_metric(spec)[1], spec.max_parallel)
        if spec.search.sampler == "tpe":
            assert sampler._constant_liar == (spec.max_parallel > 1), (
                f"TPE with max_parallel {spec.max_parallel}: constant_liar {sampler._constant_liar}"
            )
        states = {
            Outcome.ASKED: optuna.trial.TrialState.RUNNING,
            Outcome.COMPLETE: optuna.trial.TrialState.COMPLETE,
            Outcome.FAIL: optuna.trial.TrialState.FAIL,
            Outcome.PRUNED: optuna.trial.TrialState.PRUNED,
        }
        for trial, seen in zip(record.trials, study.trials, strict=True):
            assert seen.state == states[trial.outcome], (
                f"trial {trial.number} is {trial.outcome.value} in the record, the sampler was told {seen.state.name}"
            )
            if trial.outcome is Outcome.COMPLETE:
                assert seen.value == trial.value, f"trial {trial.number}: told {seen.value}, recorded {trial.value}"
            if trial.outcome is Outcome.PRUNED:
                assert sorted(seen.intermediate_values.values()) == sorted(trial.intermediate.values()), (
                    f"trial {trial.number}: the sampler has {seen.intermediate_values}, the record {trial.intermediate}"
                )

    def _check_study_writes(self) -> None:
        """Told once, and told before asked: each write of the study record changes it, and a write that asks a
        trial knows every trial whose runs had all ended before it (their final records were written earlier)."""
        previous = None
        for i, (key, data) in enumerate(self.store.writes):
            if key.endswith("status.json"):
                if i >= self.study_writes:
                    record = json.loads(data)
                    self.latest[record["run_id"]] = record
                continue
            if i < self.study_writes:
                previous = data
                continue
            assert data != previous, "the study record was written again unchanged (a trial told twice?)"
            doc = json.loads(data)
            before = json.loads(previous)["trials"] if previous else []
            if len(doc["trials"]) > len(before) and 9 in self.checked:
                for t in doc["trials"][: len(before)]:
                    ended = [
                        self.latest.get(r.run_id, {}) for r in self.sweep.runs if trial_of(r.run_id) == t["number"]
                    ]
                    if all(e.get("state") in ("succeeded", "pruned", "cancelled") for e in ended):
                        assert t["outcome"] != "asked", (
                            f"trial {len(doc['trials']) - 1} was asked before trial {t['number']}, whose runs had "
                            "all ended, was told"
                        )
            previous = data
        self.study_writes = len(self.store.writes)

    @invariant()
    def ledger_bills_what_ran(self) -> None:
        """Never more than the instances ran (priced right, each started when it was acquired)."""
        if not hasattr(self, "sweep") or self.store.refusing:
            return
        entries = get_json(self.store, layout.cost_key("h")) or {}
        now = time.time()
        for iid, entry in entries.items():
            inst = self.cloud.instances[iid]
            # on-demand (a `deadline:` bought it): 3x the spot price, orch's price for a type its table lacks
            price = PRICES[inst.itype] * (3 if inst.market == "on-demand" else 1)
            assert (entry["price_per_h"], entry["market"]) == (price, inst.market), f"{iid}: {entry}"
            assert inst.acquired[0] <= entry["start"] <= inst.acquired[1], f"{iid} billed from {entry['start']}"
            assert entry["end"] <= (inst.ended or now), f"{iid} billed after it ended"
        assert set(entries) <= set(self.cloud.instances)

    def _check_ledger_flushed(self) -> None:
        """The loop ended: the store's ledger is the controller's, and bills every second its controller saw."""
        entries = get_json(self.store, layout.cost_key("h")) or {}
        assert entries == self.backend.ledger.entries, "the ledger in the store is not the controller's"
        assert math.isclose(ledger_cost(entries), ledger_cost(self.backend.ledger.entries))
        for iid, seen in self.backend.seen.items():
            assert entries[iid]["end"] >= seen, f"{iid} was seen running at {seen}, billed until {entries[iid]['end']}"

    def check_all(self) -> None:
        """Every invariant, as Hypothesis checks them after each step (for scripted scenarios)."""
        self.one_live_attempt_per_run()
        self.nothing_bills_after_down()
        self.final_records_stay_final()
        self.final_runs_are_in_the_store()
        self.results_show_what_commands_received()
        self.trials_told_once_by_the_rule()
        self.ledger_bills_what_ran()
        self.notified_once_each_and_nothing_after_ended()
