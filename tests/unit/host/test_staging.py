"""`data:` staging and `orch data push`: a 200-file prefix in (fake) S3 staged once per host for two
runs and not again on a resume; what is already there is kept; a bad copy or source is an error; keys that leave
the folder (`..`, a link) are refused; a push uploads again what was deleted; a KMS bucket's ETags are no MD5s."""

from __future__ import annotations

import json
import os

import pytest

from orchestrator.host.staging import MANIFEST, stage
from orchestrator.wait import retry_until
from tests.conftest import run_states as status
from tests.conftest import starts


def make_files(root, n=200):
    for i in range(n):
        p = root / f"part{i % 7}" / f"f{i:03d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(100 + i))
    return root


def inodes(root):
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.rglob("*.bin")}


def test_stage_from_a_folder_fetches_only_what_differs(tmp_path):
    src, dst = make_files(tmp_path / "src", 20), tmp_path / "dst"
    first = stage(str(src), str(dst))
    assert (first.files, first.fetched) == (20, 20)
    before = inodes(dst)
    again = stage(str(src), str(dst))
    assert again.fetched == 0 and inodes(dst) == before
    (src / "part0" / "f000.bin").write_bytes(b"changed")
    assert stage(str(src), str(dst)).fetched == 1 and (dst / "part0" / "f000.bin").read_bytes() == b"changed"
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no files"):
        stage(str(tmp_path / "empty"), str(tmp_path / "d2"))


@pytest.mark.slow
def test_push_then_two_runs_on_one_host_stage_once_and_a_resume_stages_nothing(orch, cloud, job, tmp_path):
    from tests.fakecloud import BUCKET

    src = make_files(tmp_path / "dataset")
    url = f"s3://{BUCKET}/datasets/synthetic/"
    first = orch("data", "push", str(src), url)
    assert first.code == 0 and "200 files, 200 uploaded" in first.out, first.out + first.err
    again = orch("data", "push", str(src), url)
    assert again.code == 0 and "200 files, 0 uploaded" in again.out, again.out + again.err
    bad = orch("data", "push", str(src), f"s3://{BUCKET}")
    assert bad.code == 2 and "bucket and a prefix" in bad.err and "Traceback" not in bad.err

    # something already on the host (as if baked into the image): kept, not fetched again
    dest = tmp_path / "host-data"
    (dest / "part0").mkdir(parents=True)
    (dest / "part0" / "f000.bin").write_bytes((src / "part0" / "f000.bin").read_bytes())
    baked = (dest / "part0" / "f000.bin").stat().st_ino

    path = orch.sweep(f"""
        name: staged
        command: "{job(steps=2, release=True)} --shard {{shard}}"
        grid:
          shard: [a, b]
        max_parallel: 2
        store: store
        data:
          - from: {url}
            to: {dest}
    """)
    assert orch("launch", str(path), "--detach").code == 0
    retry_until(
        lambda: [v["state"] for v in status(orch, "staged").values()] == ["running"] * 2,
        120,
        0.5,
        "both runs to start",
    )
    assert len(inodes(dest)) == 200 and (dest / "part0" / "f000.bin").stat().st_ino == baked
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["source"] == url and len(manifest["files"]) == 200
    staged = inodes(dest)

    # a resume on the same host: the data is there, nothing is fetched again
    r = orch("chaos", "interrupt", "shard=a", "--grace", "20", timeout=120)
    assert r.code == 0, r.out + r.err
    retry_until(
        lambda: (
            status(orch, "staged")["shard=a"]["attempt"] == 2
            and status(orch, "staged")["shard=a"]["state"] == "running"
        ),
        120,
        0.5,
        "attempt 2 of shard=a",
    )
    assert inodes(dest) == staged
    job.release.touch()
    retry_until(
        lambda: all(v["state"] == "succeeded" for v in status(orch, "staged").values()), 120, 0.5, "the runs to end"
    )
    assert sorted(a for _, a in starts(job.marks)) == ["1", "1", "2"]
    # what each attempt's agent fetched: 199 files once (one was already there), then nothing, twice
    logs = "".join(
        (orch.home / "work" / "staged" / run / "ctl" / "agent.log").read_text() for run in ("shard=a", "shard=b")
    )
    fetched = sorted(
        int(line.split(" fetched")[0].rsplit(" ", 1)[-1]) for line in logs.splitlines() if " fetched (" in line
    )
    assert fetched == [0, 0, 199], logs


def test_a_source_that_cannot_be_staged_fails_the_run_with_the_reason(orch, job, tmp_path):
    # a missing folder is refused at validation (tests/unit/sweep/test_spec.py); one that exists but holds nothing
    # fails the run
    (tmp_path / "empty").mkdir()
    path = orch.sweep(f"""
        name: nodata
        command: "{job(steps=1)}"
        max_restarts: 0
        store: store
        data:
          - from: {tmp_path / "empty"}
            to: {tmp_path / "dest"}
    """)
    r = orch("launch", str(path), timeout=120)
    assert r.code == 1, r.out + r.err
    v = status(orch, "nodata")["run"]
    assert v["state"] == "failed" and "data staging failed" in v["reason"] and "holds no files" in v["reason"], v
    assert starts(job.marks) == []  # the command never ran


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
