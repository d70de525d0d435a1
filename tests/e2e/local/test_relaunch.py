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


def test_a_relaunch_that_gives_the_same_runs_in_another_spelling_continues_the_sweep(orch):
    text = "name: spelt\ncommand: 'echo {{lr}} {{seed}} >> {log}'\ngrid:\n  lr: {lrs}\nseeds: {seeds}\nstore: s\n"
    log = orch.tmp / "starts"
    path = orch.sweep(text.format(log=log, lrs="[0.1, 0.2]", seeds="2"))
    assert finish(orch, path).code == 0
    # the seeds as a list, the grid's values in another order: the same run ids with the same params
    path.write_text(text.format(log=log, lrs="[0.2, 0.1]", seeds="[1, 0]"))
    again = finish(orch, path)
    assert again.code == 0 and "different sweep" not in again.err, again.err
    assert sorted(log.read_text().split("\n")[:-1]) == ["0.1 0", "0.1 1", "0.2 0", "0.2 1"]  # none ran again
    runs = json.loads(orch("status", "spelt", "--json").out)["runs"]
    assert {(r["state"], r["attempt"]) for r in runs} == {("succeeded", 1)} and len(runs) == 4, runs
    # what gives other runs is still refused: another seed, another value
    for lrs, seeds in (("[0.1, 0.2]", "[0, 2]"), ("[0.1, 0.3]", "2")):
        path.write_text(text.format(log=log, lrs=lrs, seeds=seeds))
        refused = orch("launch", str(path))
        assert refused.code == 2 and "a different sweep" in refused.err, (lrs, seeds, refused.err)
