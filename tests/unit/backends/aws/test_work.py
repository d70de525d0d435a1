"""backends/aws/work.py: the work rates a controller learns from the records it reads, kept in the store's
rates.json — once per attempt however often a record is read, beside a corrupt file never on it, and the weights
they give a CreateFleet's choices (none with `aws.choose: price`)."""

from __future__ import annotations

import json

import pytest

from orchestrator.backends.aws.cloud.pools import Choice
from orchestrator.backends.aws.cloud.pricing import CostLedger, PriceBook
from orchestrator.backends.aws.work import WorkBook
from orchestrator.store.folder import LocalStore
from orchestrator.store.lifecycle import RunStatus


def book(tmp_path, choose: str = "work") -> tuple[WorkBook, LocalStore]:
    store = LocalStore(str(tmp_path / "store"))
    ledger = CostLedger(store, "s", PriceBook(lambda types, azs: {}))
    ledger.acquired("i-1", "slow", "us-east-1a", "spot", run="r", attempt=1)
    ledger.acquired("i-2", "fast", "us-east-1a", "spot", run="q", attempt=1)
    return WorkBook(store, "s", ledger, choose, "epoch"), store


def status(run: str, work: list[float], started_at: float | None = None) -> RunStatus:
    return RunStatus(run_id=run, attempt=1, work=work, started_at=started_at)


def test_each_attempt_counts_once_and_its_type_comes_from_the_ledger(tmp_path):
    b, store = book(tmp_path)
    for _ in range(3):  # the same record read at three passes
        b.learn({"r": status("r", [0, 0, 4, 4]), "q": status("q", [2, 10, 8, 12])})
    doc = json.loads((tmp_path / "store" / "s" / "rates.json").read_text())
    assert doc["attempts"] == {
        "r#1": {"type": "slow", "work": 4, "seconds": 4},
        "q#1": {"type": "fast", "work": 6, "seconds": 2},
    }
    b.learn({"q": status("q", [2, 10, 11, 13])})  # the attempt went on: its newest span replaces the older
    assert json.loads((tmp_path / "store" / "s" / "rates.json").read_text())["attempts"]["q#1"]["work"] == 9


def test_a_corrupt_rates_file_is_measured_again_never_trusted_or_a_crash(tmp_path):
    b, store = book(tmp_path)
    store.put_bytes("s/rates.json", b'{"attempts": [1, 2]')
    b.learn({"r": status("r", [0, 0, 4, 4])})
    assert json.loads(store.get_bytes("s/rates.json") or b"")["attempts"] == {
        "r#1": {"type": "slow", "work": 4, "seconds": 4}
    }
    other, _ = book(tmp_path / "again")
    other.store.put_bytes("s/rates.json", json.dumps({"work_key": "step", "attempts": {"x#1": {}}}).encode())
    assert other.doc()["attempts"] == {}  # another work key's rates are not this sweep's


def test_weights_follow_the_rates_and_price_leaves_the_choices_as_they_are(tmp_path):
    b, _ = book(tmp_path)
    b.learn({"r": status("r", [0, 0, 4, 4]), "q": status("q", [0, 0, 12, 4])})
    choices = [Choice("slow", "subnet-1", "us-east-1a"), Choice("fast", "subnet-1", "us-east-1a")]
    weighed = b.weigh(choices, lambda t, az: {"slow": 0.3, "fast": 0.45}[t])
    assert [(c.instance_type, c.weight) for c in weighed] == [("fast", 3.0), ("slow", 1.0)]
    by_price, _ = book(tmp_path / "price", choose="price")
    assert by_price.weigh(choices, lambda t, az: 0.3) == choices


def test_the_deadline_scale_is_each_runs_type_against_the_slowest_measured_one(tmp_path):
    b, _ = book(tmp_path)
    assert b.scale(["slow", "fast"]) == {}  # nothing measured: every type alike
    b.learn({"r": status("r", [0, 0, 4, 4]), "q": status("q", [0, 0, 12, 4])})  # slow: 1 epoch/s, fast: 3
    assert b.scale(["slow", "fast"]) == {"": 3.0, "q": 3.0, "r": 1.0}  # q on fast: 3x longer if it moves to slow
    assert b.scale(["fast"]) == {}  # a sweep that buys one type: nothing to convert
    assert b.scale(["slow", "fast", "unmeasured"]) == {"": 3.0, "q": 3.0, "r": 1.0}  # (taken as fast as the others)


def test_a_boot_in_rates_json_that_is_no_number_of_seconds_is_passed_over(tmp_path):
    b, store = book(tmp_path)
    doc = {"work_key": "epoch", "attempts": {}, "boots": {"r#1": float("inf"), "q#1": -3, "x#1": True, "y#1": 12.5}}
    store.put_bytes("s/rates.json", json.dumps(doc).encode())  # (json.dumps writes Infinity, as a bad file may hold)
    assert b.switch_s() == 12.5  # an Infinity made every pass's deadline line raise


def sweep_book(store: LocalStore, name: str, command: str = "python train.py") -> WorkBook:
    ledger = CostLedger(store, name, PriceBook(lambda types, azs: {}))
    return WorkBook(store, name, ledger, "work", "epoch", command)


def measured_sweep(store: LocalStore, name: str, command: str = "python train.py", reclaimed: float = 0.0):
    """A launched sweep (in the index) that measured `slow` at 1 epoch/s and `fast` at 3/s, its `slow` instance
    reclaimed at `reclaimed` when given."""
    b = sweep_book(store, name, command)
    b.keep()
    b.ledger.acquired("i-1", "slow", "us-east-1a", "spot", run="r", attempt=1)
    b.ledger.acquired("i-2", "fast", "us-east-1b", "spot", run="q", attempt=1)
    if reclaimed:
        b.ledger.entries["i-1"].update(end=reclaimed, reclaimed=reclaimed)
        b.ledger.entries["i-1"]["start"] = reclaimed - 60
    b.ledger.flush()
    b.learn({"r": status("r", [0, 0, 4, 4]), "q": status("q", [0, 0, 12, 4])})
    return b


def test_a_later_sweep_of_the_same_command_starts_from_the_rates_earlier_ones_measured(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    measured_sweep(store, "first")
    later = sweep_book(store, "later")
    later.keep()
    rates = later.measured()
    assert (rates["fast"].per_s, rates["fast"].attempts, rates["fast"].earlier) == (3.0, 1, 1)
    [best, _] = later.ranked([("slow", "us-east-1a"), ("fast", "us-east-1b")], lambda t, az: 0.3)
    assert best.instance_type == "fast" and best.note == "measured (1 attempt, 1 in earlier sweeps)"
    other = sweep_book(store, "other", command="python train.py --big")  # another command: starts unmeasured
    assert other.gather().sweeps == () and other.measured() == {}
    # a controller that did not launch (--detach's, a remote one) reads what the launch kept
    assert sweep_book(store, "later").measured()["fast"].earlier == 1


def test_reclaims_count_across_sweeps_of_any_command_and_bad_records_are_passed_over(tmp_path):
    import time

    store = LocalStore(str(tmp_path / "store"))
    measured_sweep(store, "first", reclaimed=time.time() - 30)
    store.put_bytes("broken/cost.json", b"[1, 2")  # a sweep in the index whose records are not orch's
    store.put_bytes("broken/rates.json", b'{"attempts": 3}')
    store.put_bytes(".orch-work/zz/1.broken", b"{}")
    store.put_bytes(".orch-work/zz/not-an-entry", b"{}")
    other = sweep_book(store, "other", command="python other.py")
    other.gather()  # (a launch or a dry run)
    pools = [("slow", "us-east-1a"), ("slow", "us-east-1b")]
    ranked = {w.az: w for w in other.ranked(pools, lambda t, az: 0.3)}
    assert ranked["us-east-1a"].reclaims_per_h > 1 > ranked["us-east-1b"].reclaims_per_h  # the cluster and history
    assert [w.az for w in other.ranked(pools, lambda t, az: 0.3)] == ["us-east-1b", "us-east-1a"]


def test_forget_leaves_the_command_unmeasured_for_later_sweeps_and_a_relaunch_does_not_share_it_again(tmp_path):
    from orchestrator.backends.aws import earlier

    store = LocalStore(str(tmp_path / "store"))
    first = measured_sweep(store, "first")
    assert earlier.forget(store, first.command_key) == ["first"]
    first_again = sweep_book(store, "first")
    first_again.keep()  # its relaunch: measured already, it stays out of the index
    assert first_again.measured()["fast"].earlier == 0 and first_again.measured()["fast"].attempts == 1
    assert sweep_book(store, "later").gather().sweeps == ()
    assert json.loads(store.get_bytes("first/rates.json") or b"")["attempts"]  # its own record is kept


def test_a_pool_outside_the_stores_region_adds_the_transfer_its_hosts_measured_to_its_price(tmp_path):
    from orchestrator.backends.aws.cloud.pricing import GB, transfer_rate

    store = LocalStore(str(tmp_path / "store"))
    ledger = CostLedger(store, "s", PriceBook(lambda types, azs: {}), home="us-east-1")
    ledger.acquired("i-1", "g5.xlarge", "us-west-2a", "spot", run="r", attempt=1)
    ledger.entries["i-1"].update(start=1000.0, end=4600.0)  # an hour
    b = WorkBook(store, "s", ledger, "work", "epoch")
    moved = RunStatus(run_id="r", attempt=1, work=[0, 0, 4, 4], moved={"1": [10 * GB, 2 * GB]})
    b.learn({"r": moved})
    assert json.loads(store.get_bytes("s/rates.json") or b"")["moved"] == {"r#1": [10 * GB, 2 * GB, 3600.0]}
    pools = [("g5.xlarge", "us-east-1a"), ("g5.xlarge", "us-west-2a")]
    ranked = {w.az: w for w in b.ranked(pools, lambda t, az: 0.30)}
    west = 10 * transfer_rate("us-west-2", "us-east-1") + 2 * transfer_rate("us-east-1", "us-west-2")
    assert ranked["us-west-2a"].transfer_per_h == west and ranked["us-east-1a"].transfer_per_h == 0
    assert ranked["us-west-2a"].per_unit > ranked["us-east-1a"].per_unit  # same price, same rate: the transfer
    assert f"+${west:.4f}/h transfer" in ranked["us-west-2a"].note
    # EC2 divides the instance price alone by the weight: the weight carries the transfer's share
    for w in ranked.values():  # (so EC2's price per unit is the pool's expected $ per unit, transfer included)
        assert w.price / w.effective == pytest.approx(w.per_unit)
    store.put_bytes("s/rates.json", b'{"attempts": {}, "moved": [1, 2]}')  # input: not a map, passed over
    again = WorkBook(store, "s", ledger, "work", "epoch")
    assert {w.transfer_per_h for w in again.ranked(pools, lambda t, az: 0.30)} == {0.0}
