"""What a relaunch of the same sweep file may change (docs/reference/commands.md): raising `max_restarts` retries the
runs the old count gave up on, and `timeout_minutes` may change; through `orch launch`."""

from __future__ import annotations

import json

import pytest

from tests.conftest import finish

pytestmark = pytest.mark.slow


def test_raising_max_restarts_retries_what_failed_for_good_and_timeout_may_change(orch):
    ok = orch.tmp / "ok"
    text = "name: again\ncommand: 'test -f {ok}'\ngrid:\n  x: [1]\nmax_restarts: {n}\ntimeout_minutes: {t}\nstore: s\n"
    path = orch.sweep(text.format(ok=ok, n=0, t=10))
    first = finish(orch, path)
    assert first.code == 1 and "failed" in first.out, first.out + first.err
    ok.touch()
    path.write_text(text.format(ok=ok, n=1, t=20))
    dry = orch("launch", str(path), "--dry-run")
    assert dry.code == 0 and "different sweep" not in dry.err, dry.err
    again = finish(orch, path)
    assert again.code == 0 and "1 of 1 runs succeeded" in again.out, again.out + again.err
    (run,) = json.loads(orch("status", "again", "--json").out)["runs"]
    assert (run["state"], run["attempt"]) == ("succeeded", 2), run
    record = json.loads((orch.tmp / "s" / "again" / "sweep.json").read_text())["spec"]
    assert (record["max_restarts"], record["timeout_minutes"]) == (1, 20)  # status and collect by name say so


def test_a_refused_relaunch_touches_nothing_not_even_the_lease(orch):
    text = "name: same\ncommand: 'true {x}'\ngrid:\n  x: [1]\nstore: s\n"
    path = orch.sweep(text.format(x="a"))
    assert finish(orch, path).code == 0
    lease = orch.tmp / "s" / "same" / "controller.json"
    before = lease.read_bytes()
    path.write_text(text.format(x="b"))  # another command: another sweep under the same name
    again = orch("launch", str(path))
    assert again.code == 2 and "a different sweep" in again.err and "took the sweep over" not in again.out, again.err
    assert lease.read_bytes() == before  # the record was checked before the lease was taken
