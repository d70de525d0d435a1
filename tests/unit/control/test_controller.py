"""The controller's loop (control/controller.py) with a backend of the test's own over a real folder store and a real
cost ledger (backends/aws/cloud/pricing.py): what the loop leaves in the store when it ends. (`decide()`'s table:
test_decide.py.)"""

from __future__ import annotations

import time

from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook, ledger_cost
from orchestrator.backends.base import BackendBase, Host
from orchestrator.backends.registry import load_sweep
from orchestrator.contract import RunTask
from orchestrator.control.controller import Controller
from orchestrator.control.state import State
from orchestrator.store import lifecycle as life
from orchestrator.store.base import get_json
from orchestrator.store.folder import LocalStore
from orchestrator.store.layout import cost_key
from orchestrator.store.lifecycle import Ending
from orchestrator.store.status import RUNNING, SUCCEEDED, RunStatus, update_status, write_status


class OneBilledHost(BackendBase):
    """One instance, billed at a dollar a second, seen at every pass (as the AWS backend's list() feeds its ledger);
    at the second pass its run has ended, and its instance is still listed (it goes after the record is written: the
    loop's end, waiting for it, lists it gone)."""

    name = "test"
    poll_s = 0.05

    def __init__(self, store: LocalStore):
        self.store, self.passes = store, 0
        self.ledger = CostLedger(store, "led", PriceBook(lambda types, azs: {("g5.xlarge", "us-east-1a"): 3600.0}))
        self.ledger.acquired("i-1", "g5.xlarge", "us-east-1a", "spot", run="run", attempt=1)

    def list(self) -> list[Host]:
        self.passes += 1
        self.ledger.observe(["i-1"] if self.passes <= 2 else [])
        if self.passes == 2:
            update_status(
                self.store,
                "led",
                "run",
                lambda s: life.finish(s, Ending(SUCCEEDED, "", False), 0, "") if s.state == RUNNING else None,
            )
        return [Host(run_id="run", host_id="i-1", address="127.0.0.1", attempt=1)] if self.passes <= 2 else []

    def spend(self) -> float:
        return self.ledger.spend()

    def flush(self) -> None:
        self.ledger.flush()

    def new_task(self, run_id, attempt, command, params_json, replaces="") -> RunTask:
        raise AssertionError("nothing is started")

    def start(self, task: RunTask) -> Host:
        raise AssertionError("nothing is started")

    def release(self, host: Host) -> None:
        pass


def test_the_dollars_the_loop_ends_with_are_the_ones_the_ledger_in_the_store_says(tmp_path, monkeypatch):
    """`orch launch` prints the last pass's spend, `orch collect` reads the ledger in the store: passes save the
    ledger only when an instance comes or goes (or every 30 s), so the loop's end must save what its last passes
    added."""
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    path = tmp_path / "sweep.yaml"
    path.write_text("name: led\ncommand: 'true'\nstore: store\n")
    store = LocalStore(str(tmp_path / "store"))
    write_status(
        store, "led", RunStatus(run_id="run", state=RUNNING, attempt=1, started_at=time.time(), heartbeat=time.time())
    )
    backend = OneBilledHost(store)
    controller = Controller(load_sweep(path), backend, store, State(tmp_path / "home"))
    controller.prepare()
    progress = controller.run(interval=0.05)
    assert progress.done and backend.passes == 3  # two passes, then the loop's end saw the instance gone
    assert ledger_cost(get_json(store, cost_key("led"))) == progress.spend_usd > 0


class RefusingOnce(BackendBase):
    """A host its agent left up after the run's end; the first release fails as a backend's call can (ssh down, an
    API error), the next one works."""

    name = "test"
    poll_s = 0.05

    def __init__(self):
        self.tries, self.up = 0, True

    def list(self) -> list[Host]:
        return [Host(run_id="run", host_id="h-1", address="127.0.0.1", attempt=1)] if self.up else []

    def release(self, host: Host) -> None:
        self.tries += 1
        if self.tries == 1:
            raise ConnectionError("ssh: connect to host 127.0.0.1 port 22: Connection refused")
        self.up = False


def test_a_release_that_fails_is_tried_again_at_the_next_look_and_the_pass_goes_on(tmp_path):
    from orchestrator.control.ended import EndedHosts

    backend = RefusingOnce()
    ended = EndedHosts(backend, State(tmp_path / "home"), "led", grace_s=10.0)
    done = life.finish(RunStatus(run_id="run", state=RUNNING, attempt=1), Ending(SUCCEEDED, "", False), 0, "")
    statuses, final = {"run": done}, {"run"}
    assert ended.check(backend.list(), statuses, final, now=100.0) == 1 and backend.tries == 0  # first seen
    assert ended.check(backend.list(), statuses, final, now=105.0) == 1 and backend.tries == 0  # within grace
    assert ended.check(backend.list(), statuses, final, now=110.0) == 1 and backend.tries == 1  # refused: no raise
    assert ended.check(backend.list(), statuses, final, now=111.0) == 1 and backend.tries == 2 and not backend.up
    assert ended.check(backend.list(), statuses, final, now=112.0) == 0
    cancelled = RunStatus(run_id="run", state="cancelled", attempt=1)  # ended by the controller: its agent may sync
    backend.up, backend.tries = True, 1
    assert (
        EndedHosts(backend, State(tmp_path / "home"), "led", grace_s=0.0).check(
            backend.list(), {"run": cancelled}, final, now=200.0
        )
        == 0
        and backend.tries == 1
    )
