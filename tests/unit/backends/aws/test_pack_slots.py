"""backends/aws/pack.py's choice of a free slot: a run the deadline needs on on-demand never takes a slot of a spot
instance (its move would be worth nothing); any other run may take one of an on-demand instance (paid for already)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from orchestrator.backends.aws.pack import Packer


def packer(markets: dict[str, str]) -> Packer:
    """A packer over two live 4-slot instances, one slot taken on each; `markets`: instance -> its ledger market."""
    live = [
        {"instance_id": iid, "slot_count": 4, "slots": {0: "other#1"}, "host_key": "k", "launch_time": time.time()}
        for iid in markets
    ]
    state = SimpleNamespace(
        ledger=SimpleNamespace(lock=threading.Lock(), entries={i: {"market": m} for i, m in markets.items()}),
        live=lambda: live,
        fresh={},
        reserved={},
        dead=set(),
        cfg=SimpleNamespace(max_minutes=600),
        sweep=SimpleNamespace(spec=SimpleNamespace(timeout_minutes=10)),
    )
    return Packer(state, provisioner=None)  # type: ignore[arg-type]


def test_a_run_due_on_demand_takes_only_an_on_demand_slot_and_others_take_any():
    spot_only = packer({"i-spot": "spot"})
    assert spot_only._free_slot(["on-demand"]) is None  # it buys an on-demand instance instead
    assert spot_only._free_slot(["spot"]) == ("i-spot", 1, "k")
    both = packer({"i-spot": "spot", "i-od": "on-demand"})
    assert both._free_slot(["on-demand"]) == ("i-od", 1, "k")
    assert packer({"i-od": "on-demand"})._free_slot(["spot"]) == ("i-od", 1, "k")  # its hours are paid for already
