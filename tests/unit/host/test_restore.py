"""The agent's restore of a run folder from S3 after the last host was lost: what a sync cut in the middle leaves."""

from __future__ import annotations

import hashlib
import json

from orchestrator.contract import RunTask
from orchestrator.host.agent import Agent
from orchestrator.store.s3 import S3Store
from tests.fakecloud import BUCKET, FakeCloud
from tests.unit.store.test_verified_downloads import BIG, _corrupt


def checkpoint(folder, body: bytes) -> None:
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(body)
    meta = {"state.pt": {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}}
    (folder / "MANIFEST.json").write_text(json.dumps({"files": meta}))


def test_a_host_lost_mid_sync_leaves_a_run_that_the_next_attempt_still_restores(tmp_path):
    """A host reclaimed between uploading its metrics file and the folder's index left the index older than the
    file; its newest checkpoint had a corrupted part. Each new attempt's agent crashed in its restore (seen on the
    fake cloud at load 8: four instances bought, each lost after 180 s of silence). Now the metrics file is taken
    as the store has it and the checkpoint falls back to the older one that verifies."""
    run = tmp_path / "host1" / "run"
    (run / "ckpt").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    checkpoint(run / "ckpt" / "16", b"older")
    checkpoint(run / "ckpt" / "32", b"x" * BIG)
    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        store = S3Store(f"s3://{BUCKET}/sweeps", client=s3)
        store.sync_up(run, "sw/r")
        newer = b'{"step": 1}\n{"step": 2}\n'  # uploaded; the host was gone before the index said so
        s3.put_object(Bucket=BUCKET, Key="sweeps/sw/r/metrics.jsonl", Body=newer)
        _corrupt(BUCKET, "sweeps/sw/r/ckpt/32/state.pt")
        task = RunTask(
            sweep="sw",
            run_id="r",
            attempt=2,
            command="true",
            store_url=f"s3://{BUCKET}/sweeps",
            run_dir=str(tmp_path / "host2" / "run"),
            ctl_dir=str(tmp_path / "host2" / "ctl"),
            session="orch-test-restore",
        )
        agent = Agent(task, store)
        agent._restore()
    restored = tmp_path / "host2" / "run"
    assert (restored / "metrics.jsonl").read_bytes() == newer
    assert (restored / "ckpt" / "16" / "state.pt").read_bytes() == b"older"
