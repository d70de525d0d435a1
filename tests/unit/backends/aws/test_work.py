"""backends/aws/work.py: the work rates a controller learns from the records it reads, kept in the store's
rates.json — once per attempt however often a record is read, beside a corrupt file never on it, and the weights
they give a CreateFleet's choices (none with `aws.choose: price`)."""

from __future__ import annotations

import json

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
