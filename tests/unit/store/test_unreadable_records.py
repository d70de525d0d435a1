"""Records and metrics lines that cannot be trusted are ignored or shown as such, never a crash: a summary
row of the wrong types (README: a summary that cannot be read is ignored), and JSON nested deeper than
Python parses (a metrics line, a status record, the summary), and a corrupt status record under status and collect."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from orchestrator.control import summary
from orchestrator.store.base import read_jsonl
from orchestrator.store.folder import LocalStore
from orchestrator.wait import retry_until
from tests.conftest import finish, no_traceback, run_states, starts

DEEP = "[" * 100_000 + "]" * 100_000  # deeper than json.loads recurses

ROW = {
    "attempt": 1,
    "elapsed": 0.1,
    "exit_code": 0,
    "failures": 0,
    "final": True,
    "finished_at": 1.0,
    "log_tail": "",
    "metrics": {"epoch": 1, "test_acc": 0.5},
    "preemptions": 0,
    "reached": None,
    "reason": "",
    "run_id": "a=1",
    "state": "succeeded",
}

# (what is wrong with the row, the row's field and its value)
BAD_ROWS = [
    ("metrics not a mapping", "metrics", "x"),
    ("elapsed as text", "elapsed", "x"),
    ("elapsed infinite", "elapsed", float("inf")),
    ("elapsed past any float", "elapsed", 10**400),
    ("attempt as text", "attempt", "x"),
    ("attempt true", "attempt", True),
    ("reached as text", "reached", "x"),
    ("exit code as text", "exit_code", "0"),
    ("finished_at as text", "finished_at", "x"),
    ("reason a number", "reason", 5),
    ("an unknown state", "state", "nope"),
]


def _doc(row: dict) -> dict:
    return {"version": summary.VERSION, "sweep": "s", "target": None, "runs": [row]}


def _write(store: LocalStore, doc) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    store.put_bytes("s/summary.json", text.encode())


@pytest.mark.parametrize("what, key, value", BAD_ROWS, ids=[w for w, _, _ in BAD_ROWS])
def test_a_summary_row_of_the_wrong_types_is_no_summary(tmp_path, what, key, value):
    store = LocalStore(str(tmp_path / "store"))
    _write(store, _doc(ROW))
    assert summary.read(store, "s", ["a=1"])["a=1"].state == "succeeded"  # the good row is read
    _write(store, _doc({**ROW, key: value}))
    assert summary.read(store, "s", ["a=1"]) is None  # the reader falls back to the records


def test_json_nested_too_deep_is_unreadable_not_a_crash(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    _write(store, DEEP)
    assert summary.read(store, "s", ["a=1"]) is None
    lines = read_jsonl(b'{"epoch": 1}\n{"a": ' + DEEP.encode() + b"}\n")
    assert lines == [{"epoch": 1}]


def test_status_and_collect_survive_a_corrupt_summary_and_a_metrics_line_nested_too_deep(orch):
    script = orch.tmp / "deep.py"
    script.write_text(
        "import os\n"
        "with open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'w') as f:\n"
        '    f.write(\'{"epoch": 1, "test_acc": 0.5}\\n\')\n'
        "    f.write('{\"a\": ' + '[' * 100000 + ']' * 100000 + '}\\n')\n"
    )
    path = orch.sweep(
        f"name: s\ncommand: '{sys.executable} {script}'\nstore: store\ngrid:\n  a: [1, 2]\nmax_restarts: 0\n"
    )
    r = orch("launch", str(path), timeout=120)
    assert r.code == 0 and "Traceback" not in r.out + r.err, r.out + r.err  # the agent read past the deep line
    good = json.loads(orch.store("s", "summary.json").read_text())
    assert [(row["state"], row["attempt"]) for row in good["runs"]] == [("succeeded", 1)] * 2, good
    for key, value in (("metrics", "x"), ("elapsed", "x"), ("reached", "x")):  # crashed, crashed, showed ✓ target
        doc = json.loads(json.dumps(good))
        doc["runs"][0][key] = value
        orch.store("s", "summary.json").write_text(json.dumps(doc))
        st = orch("status", "s")
        assert st.code == 0 and "Traceback" not in st.out + st.err, (key, st.out + st.err)
        assert st.out.count("│ succeeded") == 2 and "target" not in st.out, (key, st.out)
    orch.store("s", "summary.json").write_text(DEEP)
    st = orch("status", "s")
    assert st.code == 0 and st.out.count("│ succeeded") == 2, st.out + st.err
    c = orch("collect", "s", "--out", str(orch.tmp / "res"))
    assert c.code == 0 and "Traceback" not in c.out + c.err, c.out + c.err


# --- a running run's record that cannot be read (README: a record orch cannot read is never taken as final) ---


def _corrupt_record(orch, sweep: str, run: str) -> None:
    orch.store(sweep, ".orch", run, "status.json").write_bytes(b'{"run_id": "run", "state": "runn')


def test_a_running_runs_unreadable_record_is_written_over_by_its_agent_and_the_run_goes_on(orch, job):
    path = orch.sweep(f'name: torn\ncommand: "{job(steps=1, release=True)}"\nstore: store\nmax_restarts: 0\n')
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: (job.marks / "run.running").exists(), 120, 0.2, "the command to start")
    _corrupt_record(orch, "torn", "run")
    record = orch.store("torn", ".orch", "run", "status.json")

    def written_over() -> bool:
        try:
            return json.loads(record.read_text())["state"] == "running"
        except ValueError:
            return False

    retry_until(written_over, 60, 0.2, "the agent to write its record over the unreadable one")
    assert (job.marks / "run.running").exists()  # its command was never stopped
    job.release.touch()
    retry_until(lambda: run_states(orch, "torn").get("run", {}).get("state") == "succeeded", 120, 0.5, "the end")
    assert len(starts(job.marks)) == 1


def test_a_relaunch_gives_a_run_whose_record_cannot_be_read_a_new_attempt_never_counts_it_done(orch, job):
    path = orch.sweep(f'name: torn\ncommand: "{job(steps=1, release=True)}"\nstore: store\nmax_restarts: 0\n')
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: (job.marks / "run.running").exists(), 120, 0.2, "the command to start")
    assert orch("down", "torn").code == 0  # no host runs it any more
    _corrupt_record(orch, "torn", "run")
    job.release.touch()
    r = orch("launch", str(path), timeout=120)
    assert r.code == 0 and "Traceback" not in r.out + r.err, r.out + r.err
    assert "status record torn/.orch/run/status.json is not JSON" in r.err and "new attempt (2)" in r.err, r.err
    final = run_states(orch, "torn", every=True)["run"]
    assert (final["state"], final["attempt"]) == ("succeeded", 2), final
    assert starts(job.marks) == [["run", "1"], ["run", "2"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "record", [b"{}", b'{"state": null}', b'{"run_id": "run", "state": "running", "attempt": "x"', b"[1]"]
)
def test_a_corrupt_status_record_is_reported_not_a_crash(orch, record):
    path = orch.sweep("name: corrupt\ncommand: 'true'\nstore: store\n")
    assert finish(orch, path).code == 0
    key = next(orch.store("corrupt").rglob("status.json"))
    key.write_bytes(record)
    for args in (("status", "corrupt"), ("status", "corrupt", "--json"), ("status",), ("collect", "corrupt")):
        r = orch(*args)
        no_traceback(r)
        assert r.code == 0, (args, r.err)
    assert "corrupt" in orch("status", "corrupt").out


def test_a_prune_verdict_stands_over_a_record_that_cannot_be_read_and_the_relaunch_prunes_the_run(orch, tmp_path):
    # Found by the invariant harness (tests/harness): rungs.json holds a verdict the run's record does not (a controller
    # stopped between the two writes), the record is then torn and the summary says nothing final. The relaunch's
    # controller reads the record, finds it unreadable with no host (a start), and the verdict taken before stands.
    script = tmp_path / "curve.py"
    script.write_text(
        textwrap.dedent("""
            import json, os, sys, time
            x = int(sys.argv[1])
            with open(os.path.join(os.environ["ORCH_RUN_DIR"], "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"epoch": 1, "acc": x / 10}) + "\\n")
            if x < 5:
                time.sleep(600)  # a losing run: it waits to be pruned
        """)
    )
    path = orch.sweep(f"""
        name: prunetorn
        command: "{sys.executable} {script} {{x}}"
        grid:
          x: [9, 1]
        max_parallel: 1
        store: store
        prune:
          metric: acc
          rungs: [1]
          keep: 0.5
          min_runs: 2
    """)
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0, r.out + r.err
    assert run_states(orch, "prunetorn")["x=1"]["state"] == "pruned"
    rungs = json.loads(orch.store("prunetorn", "rungs.json").read_text())
    assert "x=1" in rungs["pruned"], rungs  # the verdict, kept beside the records
    _corrupt_record(orch, "prunetorn", "x=1")
    orch.store("prunetorn", "summary.json").write_text("{")  # no summary: the controller reads every record
    r = orch("launch", str(path), timeout=240)
    assert r.code == 0 and "Traceback" not in r.out + r.err and "Impossible" not in r.out + r.err, r.out + r.err
    states = run_states(orch, "prunetorn", every=True)
    assert states["x=1"]["state"] == "pruned" and states["x=9"]["state"] == "succeeded", states
    assert "pruned at epoch 1" in states["x=1"]["reason"], states["x=1"]
