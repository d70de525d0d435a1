"""Scale: a controller pass reads only what may change, the table it keeps in memory never drifts
from what a full read of every record says, and `orch status` reads the summary record."""

from __future__ import annotations

import builtins
import json
import time
from pathlib import Path

import pytest

from orchestrator.backends.base import BackendBase, Host
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import RunTask
from orchestrator.control.actions import cancel_run
from orchestrator.control.controller import Controller
from orchestrator.control.state import State
from orchestrator.store.status import FAILED, RUNNING, SUCCEEDED, RunStatus, read_status, update_status


class Counting:
    """A store that counts the requests made through it (every method of the Store protocol is one
    request or more; this counts calls)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.url = inner.url

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kw):
            self.calls += 1
            return attr(*args, **kw)

        return counted


class Hosts(BackendBase):
    """A backend whose hosts are what the test says: started tasks get a host; the test, playing
    each run's agent, writes the records and takes hosts away."""

    name = "test"

    def __init__(self, sweep_name: str, store):
        self.sweep, self.store = sweep_name, store
        self.hosts: dict[str, Host] = {}

    def list(self) -> builtins.list[Host]:
        return list(self.hosts.values())

    def new_task(self, run_id, attempt, command, params_json, replaces="") -> RunTask:
        return RunTask(
            sweep=self.sweep,
            run_id=run_id,
            attempt=attempt,
            command=command,
            store_url=self.store.url,
            run_dir="/nonexistent",
            ctl_dir="/nonexistent",
            session=run_id,
        )

    def start(self, task: RunTask) -> Host:
        self.hosts[task.run_id] = Host(
            run_id=task.run_id, host_id=f"h-{task.run_id}-{task.attempt}", address="localhost", attempt=task.attempt
        )
        return self.hosts[task.run_id]

    def release(self, host: Host) -> None:
        self.hosts.pop(host.run_id, None)

    def stop(self, run_id: str, reason: str) -> bool:
        return self.hosts.pop(run_id, None) is not None

    # the agent's part, played by the test
    def report(self, run_id: str, state: str, exit_code=None) -> None:
        def change(status: RunStatus):
            status.state, status.heartbeat, status.exit_code = state, time.time(), exit_code
            if state == FAILED:
                status.failures += 1
            if state != RUNNING:
                status.finished_at = time.time()
            return status

        update_status(self.store, self.sweep, run_id, change)
        if state != RUNNING:
            self.hosts.pop(run_id, None)


def make_sweep(tmp_path: Path, name: str, runs: int, parallel: int, store_url: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ncommand: 'true'\nstore: {store_url}\nmax_parallel: {parallel}\nmax_restarts: 0\n"
        f"grid:\n  i: [{', '.join(str(i) for i in range(runs))}]\n"
    )
    return load_sweep(path)


def rows(views) -> dict[str, tuple]:
    return {v.run_id: (v.state, v.attempt, v.failures, v.preemptions, v.final) for v in views}


def scenario(store, tmp_path: Path, name: str, full_read: bool) -> dict[str, tuple]:
    """Runs finish, fail, are cancelled while queued and while running, and a second (refused) controller
    claims runs behind the first one's back. `full_read`: the first controller reads every record every
    pass (what orch did before it kept a table). Returns how every record ends."""
    sweep = make_sweep(tmp_path, name, 12, 3, "unused")
    a_hosts, b_hosts = Hosts(name, store), Hosts(name, store)
    home = State(tmp_path / f"home-{name}")
    a = Controller(sweep, a_hosts, store, home)
    a.prepare()

    def step():
        nonlocal a
        if full_read:  # a new controller without a summary to start from: it reads every record
            store.delete_prefix(f"{name}/summary.json")
            a = Controller(sweep, a_hosts, store, home)
        progress = a.step()
        for v in progress.runs:  # what the table holds final is final in the store
            if v.final:
                assert read_status(store, name, v.run_id).state in ("succeeded", "failed", "cancelled"), v
        return progress

    step()
    ids = [r.run_id for r in sweep.runs]
    assert set(a_hosts.hosts) == set(ids[:3])
    a_hosts.report(ids[0], RUNNING)
    a_hosts.report(ids[1], SUCCEEDED, 0)
    a_hosts.report(ids[2], FAILED, 3)
    assert cancel_run(sweep, a_hosts, store, ids[6]).startswith("cancelled")  # queued: a has never read it
    step()
    assert cancel_run(sweep, a_hosts, store, ids[0]).startswith("cancelled")  # running
    b = Controller(
        sweep, b_hosts, store, State(tmp_path / f"home-b-{name}")
    )  # the second controller (its lock was elsewhere)
    b.step()  # claims what it sees startable: a's claims (no host of b's: lost to it) and queued runs a has not read
    assert set(b_hosts.hosts) - set(a_hosts.hosts), b_hosts.hosts  # at least one run a has never read
    for _ in range(40):
        progress = step()
        for rid in list(a_hosts.hosts):
            a_hosts.report(rid, SUCCEEDED, 0)
        if progress.done:
            break
    assert progress.done, progress.runs
    return {
        rid: (s.state, s.attempt, s.failures, s.preemptions, s.exit_code)
        for rid, s in ((rid, read_status(store, name, rid)) for rid in ids)
    }


@pytest.mark.timeout(300)
def test_the_in_memory_table_ends_where_a_full_read_of_every_record_does(store, tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    kept = scenario(store, tmp_path, "kept", full_read=False)
    full = scenario(store, tmp_path, "full", full_read=True)
    assert kept == full
    ids = list(kept)
    assert kept[ids[0]][0] == "cancelled" and kept[ids[6]][:2] == ("cancelled", 0)
    assert kept[ids[1]][0] == SUCCEEDED and (kept[ids[2]][0], kept[ids[2]][4]) == (FAILED, 3)
    assert sum(1 for v in kept.values() if v[3]) >= 2  # the runs b claimed were resumed by a (lost to it)


def test_a_pass_reads_the_active_runs_only(tmp_path, monkeypatch):
    """300 runs, 270 finished, 3 running: after the first pass, a pass makes a handful of requests, not 300."""
    from orchestrator.store.folder import LocalStore

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    store = Counting(LocalStore(str(tmp_path / "store")))
    sweep = make_sweep(tmp_path, "wide", 300, 3, "unused")
    hosts = Hosts("wide", store)
    c = Controller(sweep, hosts, store, State(tmp_path / "home"))
    c.prepare()
    passes = []
    while True:
        before = store.calls
        progress = c.step()
        passes.append(store.calls - before)
        if progress.count(SUCCEEDED) >= 270:
            break
        for rid in list(hosts.hosts):
            hosts.report(rid, SUCCEEDED, 0)
    assert passes[0] <= 20, passes[0]  # a new sweep: one listing shows that no record exists yet; none is read
    steady = passes[5:]
    # per pass: sweep.json exists, the touched markers, 3 running records, 3 finished ones found, 3 queued read
    # before their claim, 3 claims, the summary: about 15 — never O(runs)
    assert max(steady) <= 20, passes
    restarted = Controller(sweep, hosts, store, State(tmp_path / "home"))
    before = store.calls
    restarted.step()
    assert store.calls - before <= 20, "a restarted controller starts from the summary record, not from every record"
    (
        tmp_path / "store" / "wide" / "summary.json"
    ).unlink()  # a sweep without a summary (an older orch wrote it): every record, once
    recorded = len(list((tmp_path / "store" / "wide" / ".orch").glob("*/status.json")))  # runs never claimed have none
    assert 270 <= recorded < 300
    before = store.calls
    Controller(sweep, hosts, store, State(tmp_path / "home")).step()
    assert recorded <= store.calls - before <= recorded + 20, (recorded, store.calls - before)


@pytest.mark.timeout(120)
def test_orch_status_shows_active_and_newest_runs_and_all_lists_every_one(orch, tmp_path):
    from orchestrator.store.folder import LocalStore

    store_dir = tmp_path / "store"
    store = LocalStore(str(store_dir))
    sweep = make_sweep(tmp_path, "many", 60, 2, str(store_dir))
    state = State(orch.home)
    hosts = Hosts("many", store)
    c = Controller(sweep, hosts, store, state)
    c.prepare()
    for _ in range(25):
        c.step()
        for rid in list(hosts.hosts):
            hosts.report(rid, SUCCEEDED, 0)
    c.step()
    done = [r for r in c.table.all_views() if r.state == SUCCEEDED]
    assert len(done) >= 40
    table = orch("status", "many")
    assert table.code == 0, table.err
    assert f"{len(done)} succeeded" in table.out and "queued" in table.out
    shown = [r.run_id for r in sweep.runs if f" {r.run_id} " in table.out]
    assert len(shown) < 25 and "--all" in table.out, table.out  # the newest finished and the active, not 60 rows
    every = orch("status", "many", "--all")
    assert all(f" {r.run_id} " in every.out for r in sweep.runs), every.out
    as_json = json.loads(orch("status", "many", "--json").out)
    assert [r["run_id"] for r in as_json["runs"]] == [r.run_id for r in sweep.runs]
    assert sum(r["state"] == SUCCEEDED for r in as_json["runs"]) == len(done)


def test_a_dry_run_prints_fifty_runs_unless_asked_for_all(orch, tmp_path):
    path = tmp_path / "dry.yaml"
    path.write_text(
        "name: dry\ncommand: 'echo {i}'\nstore: store\ngrid:\n  i: [" + ", ".join(map(str, range(120))) + "]\n"
    )
    short = orch("launch", str(path), "--dry-run")
    assert (
        short.code == 0 and "i=49: echo 49" in short.out and "i=50:" not in short.out and "70 more runs" in short.out
    ), short.out
    full = orch("launch", str(path), "--dry-run", "--all")
    assert "i=119: echo 119" in full.out and "more runs" not in full.out


def test_on_a_billed_store_a_pass_reads_only_what_changed_and_still_acts_in_the_next_pass(tmp_path, monkeypatch):
    """S3 bills each request: a pass reads a live run's record when its host came, went or changed (its
    agent's mark), when the record read before would make it act, and every REREAD_S; nothing else."""
    from dataclasses import replace
    from urllib.parse import unquote

    from orchestrator.control.controller import REREAD_S
    from orchestrator.store.s3 import S3Store
    from tests.fakecloud import BUCKET, FakeCloud

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    with FakeCloud(tmp_path / "cloud") as cloud:
        client = cloud.client("s3")
        store = S3Store(f"s3://{BUCKET}/billed", client=client)
        reads = []
        client.meta.events.register(
            "before-call.s3.GetObject", lambda params, **kw: reads.append(unquote(params["url_path"].split("/")[-2]))
        )
        sweep = make_sweep(tmp_path, "billed", 6, 3, "unused")
        hosts = Hosts("billed", store)
        c = Controller(sweep, hosts, store, State(tmp_path / "home"))
        c.prepare()
        now = time.time()
        c.step(now=now)
        ids = [r.run_id for r in sweep.runs]
        for rid in ids[:3]:
            hosts.report(rid, RUNNING)
        del reads[:]
        c.step(now=now + 1)  # their hosts appeared since the last listing: read once
        assert sorted(reads) == sorted(ids[:3])
        del reads[:]
        c.step(now=now + 2)
        assert reads == []  # nothing changed: no record read
        hosts.report(ids[0], SUCCEEDED, 0)  # the end: its host goes (a session or an instance ends)
        hosts.hosts[ids[1]] = replace(hosts.hosts[ids[1]], mark="v2")  # its agent wrote (a rung, say)
        del reads[:]
        progress = c.step(now=now + 3)
        assert {ids[0], ids[1]} <= set(reads) and ids[2] not in reads
        assert next(v for v in progress.runs if v.run_id == ids[0]).final and ids[3] in hosts.hosts  # in this pass
        del reads[:]
        c.step(now=now + 3 + REREAD_S)
        assert set(ids[1:4]) <= set(reads)  # every REREAD_S, whatever changed
        del reads[:]
        c.step(now=now + 3 + REREAD_S + Hosts.stale_s + 1)  # silent past the limit: read again before the verdict
        assert set(ids[1:4]) <= set(reads)
        assert read_status(store, "billed", ids[2]).state == "lost" and ids[2] not in hosts.hosts
