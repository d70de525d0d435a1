"""A sweep's name on this machine (ORCH_HOME): one name is one sweep while its store holds it, and free again once its
store is gone — two clones of one project, each with the same sweep file, through the real CLI."""

from __future__ import annotations

import shutil

import pytest

from orchestrator.wait import retry_until
from tests.conftest import finish, no_traceback, run_states

pytestmark = pytest.mark.slow

SWEEP = "name: twin\ncommand: '{cmd}'\ngrid:\n  x: [1]\nstore: store\n"


def clone(orch, folder: str, cmd: str = "true"):
    path = orch.tmp / folder / "sweep.yaml"
    path.parent.mkdir()
    path.write_text(SWEEP.format(cmd=cmd))
    return path


def test_a_name_whose_store_is_gone_is_free_again_and_says_so(orch):
    first = clone(orch, "clone1")
    assert finish(orch, first).code == 0
    shutil.rmtree(first.parent)  # the first clone deleted, its store with it
    second = clone(orch, "clone2")
    dry = orch("launch", str(second), "--dry-run")
    assert dry.code == 0 and "holds no sweep.json of it any more" in dry.out, dry.out + dry.err
    r = finish(orch, second)
    assert r.code == 0, r.out + r.err
    assert "holds no sweep.json of it any more: it names this sweep now" in r.out, r.out
    listed = orch("status")
    assert listed.code == 0 and str(second.parent / "store") in listed.out and "gone" not in listed.out, listed.out
    down = orch("down", "twin")
    assert down.code == 0 and "Traceback" not in down.err, down.err


def test_status_lists_a_sweep_whose_store_is_gone_once_then_no_more(orch):
    first = clone(orch, "clone1")
    assert finish(orch, first).code == 0
    shutil.rmtree(first.parent / "store")
    once = orch("status")
    assert once.code == 0 and "twin" in once.out and "gone" in once.out and "unreadable" not in once.out, once.out
    again = orch("status")
    assert again.code == 0 and "twin" not in again.out, again.out
    no_traceback(orch("launch", str(first), "--dry-run"))


def test_two_live_sweeps_of_one_name_are_refused_with_a_fix_that_works_and_loses_nothing(orch):
    first, second = clone(orch, "clone1"), clone(orch, "clone2")
    assert finish(orch, first).code == 0
    refused = orch("launch", str(second))
    assert refused.code == 2 and "Traceback" not in refused.err, refused.err
    assert str(first.parent / "store") in refused.err and "`orch forget twin`" in refused.err, refused.err
    forgot = orch("forget", "twin")
    assert forgot.code == 0 and "store is untouched" in forgot.out, forgot.out + forgot.err
    assert finish(orch, second).code == 0
    assert (first.parent / "store" / "twin" / "sweep.json").is_file()  # the first sweep lost nothing
    old = orch("status", str(first), "--json")
    assert old.code == 0 and '"succeeded"' in old.out, old.out + old.err


def test_forget_refuses_while_the_sweep_runs_here(orch):
    first = clone(orch, "clone1", cmd="sleep 120")
    assert orch("launch", str(first), "--detach").code == 0
    retry_until(lambda: run_states(orch, "twin").get("x=1", {}).get("state") == "running", 60, 0.5, "x=1 to run")
    refused = orch("forget", "twin")
    assert refused.code == 2 and "`orch down twin`" in refused.err and "Traceback" not in refused.err, refused.err
    assert orch("down", "twin").code == 0
    assert orch("forget", "twin").code == 0
    assert "twin" not in orch("status").out
