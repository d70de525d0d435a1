"""The local backend when its store stops taking writes: a clear error and nothing lost, and a run whose results
cannot reach the store is not succeeded until they do."""

from __future__ import annotations

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, finish
from tests.conftest import run_states as status


@pytest.mark.slow
def test_a_store_that_becomes_unwritable_mid_run_is_a_clear_error_and_nothing_is_lost(orch, job):
    path = orch.sweep(f"""
        name: rostore
        command: "{job(steps=2, release=True)}"
        store: store
    """)
    p = orch.popen("launch", str(path))
    retry_until(lambda: status(orch, "rostore").get("run", {}).get("state") == "running", 30, 0.2, "the run")
    folder = orch.store("rostore")
    folder.rename(folder.with_name("rostore.saved"))
    folder.write_text("not a folder any more")  # every write under it now fails
    out = p.communicate(timeout=60)[0]
    assert (
        p.returncode == 2 and "cannot be read or written" in out and str(orch.store()) in out and "Traceback" not in out
    ), out
    folder.unlink()
    folder.with_name("rostore.saved").rename(folder)
    job.release.touch()  # the run was never stopped; its agent kept going and records its end once it can
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    v = status(orch, "rostore")["run"]
    assert v["state"] == "succeeded" and v["attempt"] == 1, v


@pytest.mark.slow
def test_a_run_whose_results_cannot_reach_the_store_is_not_succeeded_until_they_do(orch, job):
    path = orch.sweep(f"""
        name: finsync
        command: "{job(steps=2, release=True)}"
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    stored = orch.store("finsync", "run", "metrics.jsonl")
    retry_until(stored.exists, 30, 0.2, "a first sync of the run folder")
    folder = stored.parent
    folder.rename(folder.with_name("run.saved"))
    folder.write_text("not a folder any more")  # the run folder's writes fail; its records (.orch/) still land
    agent_log = orch.home / "work" / "finsync" / "run" / "ctl" / "agent.log"
    job.release.touch()
    retry_until(
        lambda: (
            "results are not in the store yet" in agent_log.read_text()
            or status(orch, "finsync")["run"]["state"] != "running"
        ),
        60,
        0.2,
        "the command to end and its final sync to fail",
    )
    v = status(orch, "finsync")["run"]
    assert v["state"] == "running" and "writing its results to the store" in v["reason"], v
    folder.unlink()
    folder.with_name("run.saved").rename(folder)
    retry_until(
        lambda: status(orch, "finsync", gap=ENDED_GAP_S)["run"]["state"] == "succeeded", 60, 0.2, "the run to succeed"
    )
    work = orch.home / "work" / "finsync" / "run" / "run" / "metrics.jsonl"
    assert stored.read_text() == work.read_text()
    assert len(stored.read_text().splitlines()) > 2  # the lines written after the store refused them are there
