"""Benchmark: the S3 request bill of 20 active runs, on the local and the aws backend, and how fast the
controller reacts to a run's end, a spot notice and a rung.

Every request is counted where S3 would bill it: a counting WSGI layer in front of moto's S3 server (a real
endpoint; boto3 talks HTTP to it), by method and operation. The parts that make the requests are orch's
own: each run's Agent (its Reporter's beats, its RungPassed and SyncUp checks, its syncs of the run folder
and the log, its final record) and the Controller's passes, with the lease the launch holds. What is played
by the benchmark is what is not S3: the command (a metrics line and a log line every EPOCH_S), the hosts (a
run's host is there from its claim until its agent's last record: a local session or an instance ends then)
and the clock. Time is simulated: each agent's checks, beats and the controller's passes happen when their
intervals (the tasks' and the backends' own: `new_task`, `poll_s`, `stale_s`) say, on one simulated clock,
so a simulated day costs minutes and the count does not depend on the machine's speed.

Two parts per backend:

- the bill: 20 runs active for SPAN_S simulated seconds (runs started at staggered times, none ends):
  requests per operation, requests a day, and dollars a day at S3 Standard prices;
- the reaction: a sweep with `prune:` where runs end, one gets a spot notice and the worst are pruned at a
  rung; for each event, the passes from its record reaching the store to the controller acting on it (1 is
  the next pass).

    scripts/test.sh tests/bench/test_bench_s3_requests.py -m bench -s
"""

from __future__ import annotations

import builtins
import collections
import inspect
import json
import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backends.aws.cloud.ec2 import rungs_left
from orchestrator.backends.base import BackendBase, Host
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import RUNG_TAG, RUNG_TAGS, RUNGS_TAG, rung_tag
from orchestrator.control.controller import Controller
from orchestrator.control.lease import Lease
from orchestrator.control.state import State
from orchestrator.host.agent import Agent
from orchestrator.host.watch import RungPassed, SyncUp
from orchestrator.store import lifecycle as life
from orchestrator.store.lifecycle import Ending, RunState
from orchestrator.store.status import PRUNED, read_status

pytestmark = pytest.mark.bench

RUNS = 20
EPOCH_S = 60.0  # the command writes a metrics line and a log line this often (the bill's part)
REACT_EPOCH_S = 15.0  # the same in the reaction's part
SPAN_S = float(os.environ.get("BENCH_SPAN_S", 600))  # simulated seconds of the bill's part
TICK_S = 0.25  # the simulated clock's step (the agents' watch polls at every tick)
BUCKET = "bench-bucket"
PRICE = {"PUT": 0.005e-3, "COPY": 0.005e-3, "POST": 0.005e-3, "LIST": 0.005e-3, "GET": 0.0004e-3, "HEAD": 0.0004e-3}
SECONDS_A_DAY = 86400.0
GOAL_USD_DAY = 0.50  # 20 active runs, either backend, with or without `prune:`


# --- the counting S3 endpoint ----------------------------------------------------------------------


def operation(environ) -> str:
    """How S3 bills a request: LIST for a bucket listing, else by method (DELETE is free)."""
    method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
    path = environ.get("PATH_INFO", "/").strip("/")
    if method == "GET" and ("list-type" in query or "/" not in path):
        return "LIST"
    if method == "PUT" and environ.get("HTTP_X_AMZ_COPY_SOURCE"):
        return "COPY"
    return method


class Counting:
    """WSGI middleware: counts every request by operation (and by key class) before moto answers it."""

    def __init__(self, app):
        self.app, self.lock = app, threading.Lock()
        self.ops: dict[str, int] = collections.Counter()
        self.keys: dict[str, int] = collections.Counter()

    def __call__(self, environ, start_response):
        op = operation(environ)
        with self.lock:
            self.ops[op] += 1
            self.keys[f"{op} {what(environ.get('PATH_INFO', ''))}"] += 1
        return self.app(environ, start_response)

    def reset(self) -> None:
        with self.lock:
            self.ops.clear()
            self.keys.clear()


def what(path: str) -> str:
    """A key's kind, for the breakdown: status.json, metrics.jsonl, a log, a sync index, ..."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if name.endswith(".log"):
        return "log"
    return name if "." in name else "(listing)"


class S3Server:
    def __enter__(self) -> S3Server:
        import logging
        import socket

        import boto3
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.counter = Counting(DomainDispatcherApplication(create_backend_app))
        self.server = make_server("127.0.0.1", port, self.counter, True, request_handler=MotoRequestHandler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="bench-s3")
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.client = boto3.client(
            "s3",
            region_name="us-east-1",
            endpoint_url=self.endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        self.client.create_bucket(Bucket=BUCKET)
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.thread.join(10)


# --- the simulation ---------------------------------------------------------------------------------


class Clock:
    """Simulated seconds, from now on (records written with the real time by code that reads no clock of ours
    then look recent, never stale)."""

    def __init__(self):
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def takes_now(fn) -> bool:
    return "now" in inspect.signature(fn).parameters


class SimRun:
    """One attempt of one run: orch's Agent, its checks and beats on the simulated clock; the command is a
    line writer."""

    def __init__(self, sim: Sim, task, offset: float):
        self.sim, self.task, self.rid = sim, task, task.run_id
        agent = self.agent = Agent(task, sim.store)
        agent.ctl.mkdir(parents=True, exist_ok=True)
        agent.run_dir.mkdir(parents=True, exist_ok=True)
        agent.log_file.parent.mkdir(parents=True, exist_ok=True)
        now = sim.clock()
        status = read_status(sim.store, task.sweep, task.run_id)
        agent.status = life.start(status, task.attempt, "localhost", "restoring the run folder from the store")
        agent.reporter.record(agent.status)
        agent._restore()
        agent.status = life.run(agent.status, task.attempt, "localhost", now)
        agent.reporter.record(agent.status)
        self.checks = [RungPassed(agent), SyncUp(agent, task.sync_s, first=now + task.sync_s)]
        self.next_beat = now + task.heartbeat_s
        self.next_line = now + offset
        self.epoch = 0
        self.quality = sim.quality(task.run_id)
        self.tags = None  # aws, `prune:`: the instance's tags, played; the agent removes rung tags (host/aws/tags.py)
        if task.uses(RUNG_TAGS):
            self.tags = {RUNGS_TAG: str(len(task.rungs)), **{rung_tag(r): "" for r in task.rungs}}
            agent.reporter.rungs_recorded = self.untag

    @property
    def status(self):
        """The agent's record (a transition gives the agent a new one)."""
        return self.agent.status

    def untag(self, at_rungs: dict[str, float]) -> None:
        """The agent's DeleteTags of the rungs its record now has (RungTags.recorded), on the played instance."""
        for rung in at_rungs:
            self.tags.pop(RUNG_TAG + rung, None)

    def beat(self, now: float) -> None:
        if takes_now(self.agent.reporter.beat):
            self.agent.reporter.beat(self.status, now=now)
        else:
            self.agent.reporter.beat(self.status)

    def tick(self, now: float) -> str | None:
        """Advance to `now`; 'end' when the command ended (its last record written)."""
        if self.agent.reporter.superseded:
            return "gone"
        if now >= self.next_line:
            self.epoch += 1
            self.next_line += self.sim.epoch_s
            line = {
                "epoch": self.epoch,
                "acc": self.quality * self.epoch / 10,
                "elapsed_s": self.epoch * self.sim.epoch_s,
            }
            with open(self.agent.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            with open(self.agent.log_file, "a") as f:
                f.write(f"epoch {self.epoch} acc {line['acc']:.3f}\n")
            if self.epoch >= self.sim.epochs:
                self.finish(Ending(RunState.SUCCEEDED, "", False), 0)
                return "end"
        reported = len(self.status.at_rungs)
        for check in self.checks:
            check.tick(now)
        if now >= self.next_beat:
            self.next_beat += self.task.heartbeat_s
            self.beat(now)
        if len(self.status.at_rungs) > reported:
            self.sim.rung_at.setdefault(self.rid, self.sim.passes)
        return None

    def finish(self, ending: Ending, code: int | None) -> None:
        """As the agent ends an attempt: the final sync, then the record of how it ended."""
        self.agent.sync_up()
        self.agent.rungs.report(self.status)
        self.agent.status = life.finish(self.status, ending, code, "")
        self.agent.reporter.record(self.status)

    def notice(self) -> None:
        """A spot notice, as the agent handles one: sync, then record `interrupted`."""
        self.agent.sync_up()
        self.agent.interrupt("spot interruption notice (benchmark)")


class SimHosts(BackendBase):
    """The hosts, played: a run has one from its claim until its agent's last record. Everything else
    (intervals, tasks, silence limits) is the real backend's."""

    name = "sim"

    def __init__(self, sim: Sim, real):
        self.sim, self.real = sim, real
        self.poll_s, self.stale_s, self.start_timeout_s = real.poll_s, real.stale_s, real.start_timeout_s
        self.releases_interrupted_host = real.releases_interrupted_host

    def list(self) -> builtins.list[Host]:
        """The live hosts, with what the real backend sees of their agents without a request (local: the file
        each agent touches, LocalBackend.reported; aws: a `prune:` instance's rung tags, listing.hosts)."""
        seen = getattr(self.real, "reported", lambda rid: {})
        out = []
        for rid, r in self.sim.live.items():
            host = replace(r.host, **seen(rid))
            if r.tags is not None:
                host = replace(host, mark=f"rungs left: {rungs_left(r.tags)}")
            out.append(host)
        return out

    def new_task(self, run_id, attempt, command, params_json, **kw):
        return self.real.new_task(run_id, attempt, command, params_json, **kw)

    def start(self, task) -> Host:
        if self.real.name == "aws" and task.rungs:  # as the provisioner tags a `prune:` run's own instance
            task = replace(task, host_parts=[*task.host_parts, RUNG_TAGS])
        run = SimRun(self.sim, task, self.sim.offset(task.run_id))
        run.host = Host(
            run_id=task.run_id, host_id=f"h-{task.run_id}-{task.attempt}", address="x", attempt=task.attempt
        )
        self.sim.live[task.run_id] = run
        self.sim.starts.append((self.sim.passes, task.run_id, task.attempt))
        return run.host

    def release(self, host: Host) -> None:
        self.sim.live.pop(host.run_id, None)

    def stop(self, run_id: str, reason) -> bool:
        self.sim.stopped.append((self.sim.passes, run_id))
        return self.sim.live.pop(run_id, None) is not None


class Sim:
    def __init__(
        self,
        tmp: Path,
        server: S3Server,
        backend: str,
        name: str,
        runs: int,
        prune: int | None,
        epochs: int,
        epoch_s: float,
    ):
        from orchestrator.store.s3 import S3Store

        self.epoch_s = epoch_s
        self.clock = Clock()
        self.epochs = epochs
        self.runs = runs
        self.store = S3Store(f"s3://{BUCKET}/{backend}", client=server.client)
        self.sweep = make_sweep(tmp, name, backend, runs, prune)
        self.live: dict[str, SimRun] = {}
        self.starts: list[tuple] = []
        self.stopped: list[tuple] = []
        self.passes = 0
        self.ended: list[tuple] = []  # (passes done, run) when a run's last record reached the store
        self.final_at: dict[str, int] = {}  # run -> the pass that saw it final
        self.restarted_at: dict[str, int] = {}  # run -> the pass that claimed its attempt 2
        self.pruned_at: dict[str, int] = {}  # run -> the pass that pruned it
        self.rung_at: dict[str, int] = {}  # run -> passes done when its line at the rung reached the store
        real = real_backend(self.sweep)
        self.hosts = SimHosts(self, real)
        self.controller = Controller(self.sweep, self.hosts, self.store, State(tmp / "home"))
        self.controller.prepare()
        self.lease = Lease(self.store, name, tmp / "home").acquire()
        self.controller.lease = self.lease
        self.next_pass = self.clock()

    def quality(self, rid: str) -> float:
        return (int(rid.split("=")[1]) + 1) / self.runs

    def offset(self, rid: str) -> float:
        return self.epoch_s * (1 + (int(rid.split("=")[1]) % 10) / 10)  # staggered first lines

    def one_pass(self) -> None:
        now = self.clock()
        if takes_now(self.lease.renew):
            self.lease.renew(now=now)
        else:
            self.lease.renew()
        if takes_now(self.controller.step):
            self.controller.step(now=now)
        else:
            self.controller.step()
        self.passes += 1
        table = self.controller.table
        for rid, status in table.status.items():
            if rid in table.final:
                self.final_at.setdefault(rid, self.passes)
            if status.attempt >= 2:
                self.restarted_at.setdefault(rid, self.passes)
            if status.state == PRUNED:
                self.pruned_at.setdefault(rid, self.passes)

    def advance(self, until: float, on_tick=None) -> None:
        while self.clock.t < until:
            self.clock.t += TICK_S
            now = self.clock.t
            for rid, run in list(self.live.items()):
                if run.tick(now) in ("end", "gone"):
                    self.live.pop(rid, None)
                    self.ended.append((self.passes, rid))
            if on_tick is not None:
                on_tick(self, now)
            if now >= self.next_pass:
                self.next_pass += self.hosts.poll_s
                self.one_pass()


def make_sweep(tmp: Path, name: str, backend: str, runs: int, prune: int | None):
    path = tmp / f"{name}.yaml"
    text = (
        f"name: {name}\nbackend: {backend}\ncommand: 'true'\ngrid:\n  q: {list(range(runs))}\n"
        f"max_parallel: {RUNS}\nmax_restarts: 0\nstore: s3://{BUCKET}/{backend}\n"
        f"local:\n  workdir: {tmp / 'work' / name}\n"
    )
    if backend == "aws":
        text += "aws:\n  image: ami-12345678\n"
    if prune is not None:  # a rung at epoch `prune`
        text += f"prune:\n  metric: acc\n  at: epoch\n  rungs: [{prune}]\n  keep: 0.5\n  min_runs: 4\n"
    path.write_text(text)
    return load_sweep(path)


def real_backend(sweep):
    if sweep.spec.backend == "aws":
        from orchestrator.backends.aws.backend import AwsBackend

        return AwsBackend(sweep)
    from orchestrator.backends.local.backend import LocalBackend

    return LocalBackend(sweep)


def dollars(ops: dict[str, int], span: float) -> float:
    return sum(PRICE.get(op, 0.0) * n for op, n in ops.items()) * SECONDS_A_DAY / span


# --- the two parts --------------------------------------------------------------------------------------


def bill(tmp: Path, server: S3Server, backend: str, prune: bool) -> dict:
    """20 runs active for SPAN_S: requests per operation, a day, and their price. With `prune`: a sweep with a rung
    none reaches in the span (what waiting for a rung costs)."""
    name = f"bill-{backend}{'-prune' if prune else ''}"
    sim = Sim(tmp, server, backend, name, RUNS, prune=10**6 if prune else None, epochs=10**6, epoch_s=EPOCH_S)
    sim.advance(sim.clock() + 2 * EPOCH_S)  # every run claimed, started and past its first lines
    assert len(sim.live) == RUNS
    server.counter.reset()
    start = sim.clock()
    sim.advance(start + SPAN_S)
    ops, keys = dict(server.counter.ops), dict(server.counter.keys)
    return {
        "ops": ops,
        "keys": keys,
        "per_day": {k: v * SECONDS_A_DAY / SPAN_S for k, v in ops.items()},
        "usd_day": dollars(ops, SPAN_S),
        "passes": sim.passes,
        "poll_s": sim.hosts.poll_s,
    }


def reaction(tmp: Path, server: S3Server, backend: str) -> dict:
    """A prune sweep of RUNS + 4 runs (4 wait in the queue), 5 epochs each: for each end, notice and rung,
    the passes from its record reaching the store to the controller's act (1: the very next pass)."""
    sim = Sim(tmp, server, backend, f"react-{backend}", RUNS + 4, prune=3, epochs=5, epoch_s=REACT_EPOCH_S)
    noticed: dict[str, int] = {}

    def inject(s: Sim, now: float) -> None:
        run = s.live.get("q=23")  # the best run: never pruned
        if not noticed and run is not None and run.epoch >= 1:
            run.notice()
            s.live.pop("q=23")
            noticed["q=23"] = s.passes

    sim.advance(sim.clock() + 9 * REACT_EPOCH_S, inject)
    out = {
        "end": [sim.final_at[r] - p for p, r in sim.ended if r in sim.final_at],
        "notice": [sim.restarted_at.get(r, 10**6) - p for r, p in noticed.items()],
        "rung": [sim.pruned_at[r] - sim.rung_at[r] for r in sim.pruned_at],
        "ended": len(sim.ended),
        "unseen_ends": [r for _, r in sim.ended if r not in sim.final_at],
    }
    assert out["rung"] and out["notice"] and out["end"], out
    return out


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("backend", ["local", "aws"])
def test_s3_request_bill_of_twenty_active_runs(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path / "hosthome"))  # the aws tasks' `~` folders
    with S3Server() as server:
        for k, v in {
            "AWS_ENDPOINT_URL": server.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            monkeypatch.setenv(k, v)
        usd = {}
        for prune in (False, True):
            b = bill(tmp_path, server, backend, prune)
            usd[prune] = b["usd_day"]
            day = ", ".join(f"{op} {n:,.0f}" for op, n in sorted(b["per_day"].items()))
            print(
                f"\n{backend}{' with prune' if prune else ''}: {RUNS} active runs (a metrics and a log line every "
                f"{EPOCH_S:.0f} s), {SPAN_S:.0f} simulated s: ${b['usd_day']:.2f} a day at S3 Standard prices; "
                f"requests a day: {day}"
            )
            top = sorted(b["keys"].items(), key=lambda kv: -PRICE.get(kv[0].split()[0], 0) * kv[1])[:8]
            print("  most billed: " + "; ".join(f"{k} {v * SECONDS_A_DAY / SPAN_S:,.0f}/day" for k, v in top))
        re = reaction(tmp_path, server, backend)
        print(
            f"  reaction in passes of {b['poll_s']:g} s (1 = the next pass): end {summary(re['end'])}, notice "
            f"{summary(re['notice'])}, rung {summary(re['rung'])}"
        )
    assert not re["unseen_ends"]
    # the goal, and no slower reaction than before: every end, notice and rung acted on at the next pass
    assert max(usd.values()) <= GOAL_USD_DAY, usd
    assert max(re["end"] + re["notice"] + re["rung"]) == 1, re


def summary(values: list[int]) -> str:
    values = sorted(values)
    return f"median {values[len(values) // 2]}, max {values[-1]} (of {len(values)})"
