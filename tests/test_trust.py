"""What an adversarial newcomer found (issue: Trust), each reproduced through the CLI: a sweep named
instead of given as a file, crashed nodes, data keys that point outside their folder, a killed tmux
session, a deleted S3 object, absurd shapes, placeholders that bypass quoting, nested misspellings."""

from __future__ import annotations

import os

import pytest

from orchestrator.wait import retry_until
from tests.conftest import ENDED_GAP_S, starts
from tests.conftest import run_states as status


def _bad(r, *words):
    assert r.code == 2, r.out + r.err
    assert "Traceback" not in r.err
    for w in words:
        assert w in r.err, r.err


@pytest.mark.slow
def test_every_command_by_name_addresses_the_runs_of_the_file(orch, job):
    # grid keys not in alphabetical order: records are written with sorted keys
    path = orch.sweep(f"""
        name: named
        command: "{job(steps=2, release=True)}"
        grid:
          lr: [0.1, 0.2]
          batch_size: [64]
        max_parallel: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    ids = {"lr=0.1,batch_size=64", "lr=0.2,batch_size=64"}
    retry_until(
        lambda: {k for k, v in status(orch, str(path)).items() if v["state"] == "running"} == ids,
        60,
        0.3,
        "both runs to run",
    )
    by_name = status(orch, "named")
    assert set(by_name) == ids and all(v["state"] == "running" for v in by_name.values()), by_name
    log = orch.store("named", ".orch", "lr=0.1,batch_size=64", "logs", "1.log")
    retry_until(lambda: log.exists() and "tick" in log.read_text(), 60, 0.3, "the log to reach the store")
    logs = orch("logs", "lr=0.1,batch_size=64")
    assert logs.code == 0 and "tick" in logs.out, logs.out + logs.err
    down = orch("down", "named")
    assert down.code == 0 and "nothing of sweep" not in down.out, down.out + down.err
    final = status(orch, str(path))
    assert {v["state"] for v in final.values()} == {"stopped"}, final
    assert orch.tmux("list-sessions").stdout.count("orch_named_") == 0


@pytest.mark.slow
def test_a_local_node_that_crashes_fails_the_run_at_once_with_its_code(orch):
    path = orch.sweep("""
        name: nodecrash
        command: 'if [ "$ORCH_NODE_RANK" = 1 ]; then exit 3; fi; exec sleep 3600'
        resources: {nodes: 2}
        max_restarts: 0
        store: store
    """)
    orch("launch", str(path), timeout=120)  # without the fix node 0 sleeps on: the launch times out
    v = status(orch, "nodecrash")["run"]
    assert v["state"] == "failed" and v["exit_code"] == 3, v
    assert "sleep 3600" not in os.popen("ps -eo args").read()


@pytest.mark.slow
def test_killing_a_runs_tmux_session_restarts_it_and_the_old_agent_leaves_the_new_attempt_alone(orch, job):
    path = orch.sweep(f"""
        name: killed
        command: "{job(steps=2, release=True)}"
        max_restarts: 2
        store: store
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(lambda: status(orch, "killed").get("run", {}).get("state") == "running", 60, 0.3, "attempt 1 to run")
    assert orch.tmux("kill-session", "-t", "=orch_killed_run").returncode == 0
    retry_until(
        lambda: (v := status(orch, "killed")["run"])["attempt"] == 2 and v["state"] == "running",
        120,
        0.3,
        "attempt 2 to run",
    )

    def agents(attempt):
        return [
            line
            for line in os.popen("ps -eo args").read().splitlines()
            if "orchestrator.host.agent" in line and f"task-{attempt}.json" in line
        ]

    retry_until(
        lambda: not agents(1), 120, 0.3, "attempt 1's agent to finish"
    )  # it used to SIGKILL attempt 2 on its way out
    assert status(orch, "killed")["run"]["state"] == "running"
    job.release.touch()
    retry_until(
        lambda: status(orch, "killed", gap=ENDED_GAP_S)["run"]["state"] in ("succeeded", "failed"),
        120,
        0.3,
        "the run to end",
    )
    v = status(orch, "killed")["run"]
    assert v["state"] == "succeeded" and v["attempt"] == 2 and v["failures"] == 0, v
    assert [a for _, a in starts(job.marks)] == ["1", "2"]


def test_staging_refuses_keys_that_leave_the_folder(tmp_path):
    from orchestrator.host.staging import stage
    from tests.fakecloud import BUCKET, FakeCloud

    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        s3.put_object(Bucket=BUCKET, Key="datasets/evil/ok.bin", Body=b"fine")
        s3.put_object(Bucket=BUCKET, Key="datasets/evil/x/../../../../pwned", Body=b"gotcha")
        dest = tmp_path / "host" / "data"
        with pytest.raises(OSError, match=r"outside .*x/\.\./\.\./\.\./\.\./pwned"):
            stage(f"s3://{BUCKET}/datasets/evil/", str(dest), s3)
        assert not any(p.name == "pwned" for p in tmp_path.rglob("*"))
        assert not (dest / "ok.bin").exists()  # refused before anything was written


def test_staging_refuses_a_key_under_a_link_in_the_folder_that_points_outside(tmp_path):
    from orchestrator.host.staging import stage

    src, dest, outside = tmp_path / "src", tmp_path / "host" / "data", tmp_path / "elsewhere"
    (src / "link").mkdir(parents=True)
    (src / "link" / "f.bin").write_bytes(b"payload")
    (src / "ok.bin").write_bytes(b"fine")
    dest.mkdir(parents=True)
    outside.mkdir()
    (dest / "link").symlink_to(outside)  # left in the folder by someone, or by an earlier data set
    with pytest.raises(OSError, match=r"outside .*'link/f\.bin'.*a link"):
        stage(str(src), str(dest))
    assert not any(outside.iterdir()) and not (dest / "ok.bin").exists()


def test_data_push_uploads_again_what_was_deleted_from_s3(tmp_path):
    from orchestrator.host.staging import push
    from tests.fakecloud import BUCKET, FakeCloud

    src = tmp_path / "ds"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        (src / "a" / f"{i}.bin").write_bytes(os.urandom(64))
    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        url = f"s3://{BUCKET}/datasets/ds/"
        assert push(src, url, s3).fetched == 3
        assert push(src, url, s3).fetched == 0
        s3.delete_object(Bucket=BUCKET, Key="datasets/ds/a/1.bin")
        again = push(src, url, s3)
        assert again.fetched == 1
        assert s3.head_object(Bucket=BUCKET, Key="datasets/ds/a/1.bin")["ContentLength"] == 64


@pytest.mark.parametrize(
    "resources, words",
    [
        ("{nodes: 1000}", ["resources.nodes", "64"]),
        ("{nodes: 99999999999999999999999}", ["resources.nodes"]),
        ("{gpus: 100000}", ["resources.gpus", "16"]),
        ("{procs_per_node: 100000}", ["resources.procs_per_node", "256"]),
        ("{nodes: 64, procs_per_node: 200}", ["resources.nodes", "per core"]),
    ],
)
def test_absurd_shapes_are_refused(orch, resources, words):
    path = orch.sweep(f"""
        name: absurd
        command: "true"
        resources: {resources}
    """)
    _bad(orch("launch", str(path), "--dry-run"), str(path), *words)


@pytest.mark.parametrize(
    "command, shown",
    [
        ("echo {v!r}", "{v!r}"),
        ("echo {torchrun.x}", "{torchrun.x}"),
        ("echo {v:>9}", "{v:>9}"),
        ("echo {v[0]}", "{v[0]}"),
    ],
)
def test_only_plain_placeholders(orch, tmp_path, command, shown):
    path = orch.sweep(f"""
        name: holders
        command: '{command}'
        grid:
          v: ["$(touch {tmp_path}/owned)"]
    """)
    _bad(orch("launch", str(path), "--dry-run"), "command", shown, "only plain {name}")
    assert not (tmp_path / "owned").exists()


@pytest.mark.parametrize(
    "section, wanted",
    [
        ("resources: {gpu: 1}", "did you mean `gpus`"),
        ("data: [{from: s3://b/p/, too: x}]", "did you mean `to`"),
        ("backend: aws\nstore: s3://b/p\naws: {image: ami-1, regionn: us-east-1}", "did you mean `region`"),
        ("backend: aws\nstore: s3://b/p\naws: {image: ami-1, ssh: {usr: ubuntu}}", "did you mean `user`"),
    ],
)
def test_nested_misspellings_get_the_hint_of_their_section(orch, section, wanted):
    path = orch.sweep(f"name: typo\ncommand: 'true'\n{section}\n")
    r = orch("launch", str(path), "--dry-run")
    _bad(r, wanted)
    assert "max_parallel" not in r.err  # not the top level's fields


@pytest.mark.parametrize(
    "entry, words",
    [
        ("{from: missing-folder, to: d}", ["data[0].from", "no such folder"]),
        ("{from: sweep.yaml, to: d}", ["data[0].from", "not a folder"]),
        ("{from: ., to: ../../outside}", ["data[0].to", "leaves orch's data folder"]),
    ],
)
def test_data_entries_that_cannot_work_are_validation_errors(orch, entry, words):
    path = orch.sweep(f"name: dataval\ncommand: 'true'\ndata: [{entry}]\n")
    _bad(orch("launch", str(path), "--dry-run"), *words)
    _bad(orch("launch", str(path)), *words)


@pytest.mark.slow
def test_collect_in_80_columns_cuts_no_id_state_or_number(orch):
    script = orch.tmp / "metrics.py"
    script.write_text(
        "import json, os\nrow = dict(epoch=1, train_loss=0.123456, test_acc=0.791234, lr=0.01, images_per_s=12345.6)\n"
        "open(os.path.join(os.environ['ORCH_RUN_DIR'], 'metrics.jsonl'), 'w').write(json.dumps(row) + '\\n')\n"
    )
    path = orch.sweep(f"""
        name: narrow
        command: "{{python}} {script}"
        grid:
          lr: [0.001, 0.002, 0.003]
          batch_size: [64, 128]
        max_parallel: 3
        store: store
    """)
    assert orch("launch", str(path), timeout=200).code == 0
    orch.env["COLUMNS"] = "80"
    r = orch("collect", "narrow", "--out", str(orch.tmp / "res"))
    assert r.code == 0, r.err
    table = r.out.split("wrote")[0]
    assert "…" not in table and "..." not in table, table
    assert max(len(x) for x in table.splitlines()) <= 80, table
    for lr in ("0.001", "0.002", "0.003"):
        for bs in ("64", "128"):
            assert f"lr={lr},batch_size={bs}" in table, table
    assert table.count("succeeded") == 6 and "0.7912" in table
    wide = orch("collect", "narrow", "--out", str(orch.tmp / "res2"), "--wide")
    assert wide.code == 0 and "best test_acc" in wide.out and "not shown" not in wide.out, wide.out


def test_staging_from_a_kms_bucket_does_not_take_etags_for_md5s(tmp_path):
    from orchestrator.host.staging import push, stage
    from tests.fakecloud import FakeCloud

    src = tmp_path / "ds"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.bin").write_bytes(os.urandom(1000 + i))
    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        s3.create_bucket(Bucket="orch-kms")
        cloud.gate.kms_buckets.add("orch-kms")  # its objects' ETags are no MD5s, as under SSE-KMS
        assert push(src, "s3://orch-kms/ds/", s3).fetched == 3
        head = s3.head_object(Bucket="orch-kms", Key="ds/0.bin", ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256"), head  # push stores a SHA-256 with every object
        got = stage("s3://orch-kms/ds/", str(tmp_path / "staged"), s3)
        assert got.fetched == 3 and (tmp_path / "staged" / "2.bin").read_bytes() == (src / "2.bin").read_bytes()


@pytest.mark.parametrize("columns,wide", [("60", False), ("40", False), ("80", True)])
def test_collect_never_cuts_ids_states_or_times_however_narrow(orch, columns, wide):
    import json
    import time

    from orchestrator.backends.registry import load_sweep
    from orchestrator.store.folder import LocalStore
    from orchestrator.store.status import RunStatus, write_status

    path = orch.sweep("""
        name: cut
        command: 'true'
        grid:
          learning_rate: [0.001, 0.002]
          batch_size: [64, 128]
        store: store
    """)
    sweep, store = load_sweep(path), LocalStore(str(orch.store()))
    for run in sweep.runs:
        now = time.time()
        write_status(
            store,
            "cut",
            RunStatus(run_id=run.run_id, state="succeeded", attempt=1, started_at=now - 3723, finished_at=now),
        )
        row = {"epoch": 3, "train_loss": 0.123456, "test_acc": 0.791234, "val_acc": 0.5, "val_loss": 1.5}
        store.put_bytes(f"cut/{run.run_id}/metrics.jsonl", (json.dumps(row) + "\n").encode())
    orch.env["COLUMNS"] = columns
    r = orch("collect", str(path), "--out", str(orch.tmp / "res"), *(["--wide"] if wide else []))
    assert r.code == 0, r.err
    table = r.out.split("wrote")[0]
    assert "…" not in table, table
    ids, states = [], []  # an id may wrap over lines (its next line has no state), never be cut
    for line in table.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            if cells[1]:
                ids.append(cells[0])
                states.append(cells[1])
            else:
                ids[-1] += cells[0]
    assert sorted(ids) == sorted(r.run_id for r in sweep.runs) and states == ["succeeded"] * 4, table
    if wide:
        assert "best test_acc" in table and "not shown" not in table, table
