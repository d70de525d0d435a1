"""Stores: LocalStore on disk and S3Store on moto — put/get/list and content-comparing sync; S3's 403 for a key
that exists is an error, for one the listing does not show it is a missing key."""

from __future__ import annotations

import os

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from orchestrator.store.base import atomic_write, links_out
from orchestrator.store.s3 import S3Store


def test_put_get_list(store):
    store.put_bytes("sw/run/status.json", b"{}")
    assert store.get_bytes("sw/run/status.json") == b"{}"
    assert store.get_bytes("sw/nope.json") is None
    assert store.list("sw") == ["sw/run/status.json"]


def test_sync_compares_content(store, tmp_path):
    src = tmp_path / "run"
    (src / "ckpt" / "10").mkdir(parents=True)
    (src / "metrics.jsonl").write_text('{"step": 1}\n')
    (src / "ckpt" / "10" / "state.pt").write_bytes(b"A" * 1000)
    first = store.sync_up(src, "sw/r")
    assert (first.copied, first.skipped) == (2, 0)
    again = store.sync_up(src, "sw/r")
    assert (again.copied, again.skipped) == (0, 2)
    # same size, same mtime, other bytes: only a content check notices
    state = src / "ckpt" / "10" / "state.pt"
    st = state.stat()
    state.write_bytes(b"B" * 1000)
    os.utime(state, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = store.sync_up(src, "sw/r")
    assert changed.copied == 1 and store.get_bytes("sw/r/ckpt/10/state.pt") == b"B" * 1000

    dst = tmp_path / "restored"
    down = store.sync_down("sw/r", dst)
    assert down.copied == 2
    assert (dst / "ckpt" / "10" / "state.pt").read_bytes() == b"B" * 1000
    assert store.sync_down("sw/r", dst).copied == 0


def test_a_link_out_of_the_run_folder_is_never_followed_and_one_inside_syncs_what_it_names(store, tmp_path):
    src, secret = tmp_path / "run", tmp_path / "home" / ".ssh"
    secret.mkdir(parents=True)
    (secret / "id_ed25519").write_text("PRIVATE KEY")
    (src / "ckpt").mkdir(parents=True)
    (src / "ckpt" / "state.pt").write_bytes(b"A")
    (src / "key").symlink_to(secret / "id_ed25519")  # a file outside: its bytes are not the run's
    (src / "dotssh").symlink_to(secret)  # a folder outside
    (src / "latest.pt").symlink_to("ckpt/state.pt")  # inside: the file it names
    store.sync_up(src, "sw/r")
    synced = sorted(k for k in store.list("sw/r") if "/." not in k)  # (S3: beside them, the sync's own index)
    assert synced == ["sw/r/ckpt/state.pt", "sw/r/latest.pt"], store.list("sw/r")
    assert all(b"PRIVATE KEY" not in (store.get_bytes(k) or b"") for k in store.list("sw"))
    assert links_out(src) == ["dotssh", "key"]


def test_s3_check_names_the_missing_bucket(tmp_path):
    from orchestrator.errors import OrchError
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud") as cloud, pytest.raises(OrchError, match="bucket nope does not exist"):
        S3Store("s3://nope/x", client=cloud.client("s3")).check()


def test_a_buckets_region_is_read_as_s3_answers_it_null_for_us_east_1_and_eu_for_legacy_eu_west_1(tmp_path):
    """GetBucketLocation (S3 API reference): "Buckets in Region us-east-1 have a LocationConstraint of null. Buckets
    with a LocationConstraint of EU reside in eu-west-1." moto answers null and eu-west-1 as S3 does, and refuses to
    make an `EU` bucket: the gate answers `EU` for one it is told was made so (`legacy_eu`)."""
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud") as cloud:
        s3 = cloud.client("s3")
        s3.create_bucket(Bucket="in-virginia")
        for name in ("in-ireland", "in-ireland-since-2010"):
            s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        cloud.gate.legacy_eu.add("in-ireland-since-2010")
        assert s3.get_bucket_location(Bucket="in-virginia").get("LocationConstraint") is None
        assert s3.get_bucket_location(Bucket="in-ireland-since-2010")["LocationConstraint"] == "EU"
        regions = {b: S3Store(f"s3://{b}/x", client=s3).region() for b in ("in-virginia", "in-ireland-since-2010")}
        assert regions == {"in-virginia": "us-east-1", "in-ireland-since-2010": "eu-west-1"}
        assert S3Store("s3://in-ireland/x", client=s3).region() == "eu-west-1"


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write(tmp_path / "a" / "f.json", b"1")
    atomic_write(tmp_path / "a" / "f.json", b"2")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["f.json"]
    assert (tmp_path / "a" / "f.json").read_bytes() == b"2"


def test_the_store_keeps_the_checkpoints_the_run_keeps_and_restores_selectively(store, tmp_path):
    from orchestrator.store.layout import is_checkpoint

    src = tmp_path / "run"
    for step in (10, 20):
        (src / "ckpt" / str(step)).mkdir(parents=True)
        (src / "ckpt" / str(step) / "state.pt").write_bytes(str(step).encode() * 100)
    (src / "notes.txt").write_text("mine")
    store.sync_up(src, "sw/r", prune=is_checkpoint)
    import shutil

    shutil.rmtree(src / "ckpt" / "10")  # the trainer pruned an old checkpoint
    (src / "old.txt").write_text("x")
    r = store.sync_up(src, "sw/r", prune=is_checkpoint)
    assert r.deleted == 1
    assert sorted(k.split("/", 2)[2] for k in store.list("sw/r") if not k.endswith(".orch-sync.json")) == [
        "ckpt/20/state.pt",
        "notes.txt",
        "old.txt",
    ]
    (src / "notes.txt").unlink()  # not a checkpoint: never pruned from the store
    store.sync_up(src, "sw/r", prune=is_checkpoint)
    assert any(k.endswith("notes.txt") for k in store.list("sw/r"))
    dst = tmp_path / "restored"
    got = store.sync_down("sw/r", dst, only=lambda rel: not is_checkpoint(rel))
    assert got.copied == 2 and not (dst / "ckpt").exists()


def test_an_unchanged_resync_makes_no_request_and_the_logs_keep_no_index(tmp_path):
    """The agent syncs every `sync_s`: a sync of what did not change costs nothing (the store remembers the
    index it wrote), and the logs (read key by key, never synced down) are uploaded without an index."""
    from tests.fakecloud import BUCKET, FakeCloud

    with FakeCloud(tmp_path / "cloud") as cloud:
        client = cloud.client("s3")
        store = S3Store(f"s3://{BUCKET}/pre", client=client)
        calls = []
        client.meta.events.register("before-call.s3", lambda model, **kw: calls.append(model.name))
        run, logs = tmp_path / "run", tmp_path / "logs"
        run.mkdir()
        logs.mkdir()
        (run / "metrics.jsonl").write_text('{"epoch": 1}\n')
        (logs / "1.log").write_text("epoch 1\n")
        store.sync_up(run, "sw/r")
        store.sync_up(logs, "sw/.orch/r/logs", indexed=False)
        del calls[:]
        assert (
            store.sync_up(run, "sw/r").skipped == 1
            and store.sync_up(logs, "sw/.orch/r/logs", indexed=False).skipped == 1
        )
        assert calls == []
        (run / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n')
        (logs / "1.log").write_text("epoch 1\nepoch 2\n")
        store.sync_up(run, "sw/r")
        store.sync_up(logs, "sw/.orch/r/logs", indexed=False)
        assert sorted(calls) == ["PutObject", "PutObject", "PutObject"]  # the two files and the run folder's index
        assert store.list("sw/.orch/r/logs") == ["sw/.orch/r/logs/1.log"]
        assert store.get_bytes("sw/.orch/r/logs/1.log") == b"epoch 1\nepoch 2\n"
        fresh = S3Store(f"s3://{BUCKET}/pre", client=client)  # another process (a new attempt): reads the index once
        assert fresh.sync_up(run, "sw/r").skipped == 1
        assert fresh.sync_down("sw/r", tmp_path / "restored").copied == 1
        assert (tmp_path / "restored" / "metrics.jsonl").read_text().count("epoch") == 2


def test_boto3_clients_are_made_once_per_process_and_environment(monkeypatch):
    """Each client costs 0.13-0.26 s of CPU (its model, the session's hooks): `orch status` made four."""
    from orchestrator.backends.aws.cloud.ec2 import client as ec2_client
    from orchestrator.store import clients
    from orchestrator.store.s3 import S3Store

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    one, two = S3Store("s3://bucket/a"), S3Store("s3://bucket/b")
    assert one.client is two.client and ec2_client("ec2", "us-east-1") is ec2_client("ec2", "us-east-1")
    assert ec2_client("ec2", "us-east-1") is not ec2_client("ec2", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")  # another endpoint (a test's next fake cloud)
    assert S3Store("s3://bucket/a").client is not one.client
    assert S3Store("s3://bucket/a").client.meta.endpoint_url == "http://127.0.0.1:2"
    assert clients.client("s3") is S3Store("s3://bucket/c").client


def test_a_hosts_ec2_client_waits_seconds_not_botocores_minute(monkeypatch):
    """An ending agent removes its slot tag before it leaves its slot: a hung EC2 call must not keep its instance
    (and its bill) for botocore's 60 s per try."""
    from orchestrator.host.aws import tags
    from orchestrator.store import clients

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    made = clients.client("ec2", "us-east-1", max_attempts=3, read_timeout=tags.CALL_TIMEOUT_S)
    assert (made.meta.config.read_timeout, made.meta.config.connect_timeout) == (10.0, 5.0)
    assert made.meta.config.retries["total_max_attempts"] == 4  # botocore's max_attempts counts retries
    assert clients.client("ec2", "us-east-1", max_attempts=3) is not made
    assert clients.client("ec2", "us-east-1").meta.config.read_timeout == 60


def _s3():
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def test_a_403_on_a_key_that_exists_is_an_error_not_missing():
    client, stub = _s3()
    denied = {"Bucket": "b", "Key": "p/sweep/.orch/r/status.json"}
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "p/sweep/.orch/r/status.json"}], "KeyCount": 1},
        {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1},
    )
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2",
        {"Contents": [{"Key": "p/sweep/.orch/r/status.json"}], "KeyCount": 1},
        {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1},
    )
    with stub, pytest.raises(ClientError, match="AccessDenied"):
        S3Store("s3://b/p", client=client).get_bytes("sweep/.orch/r/status.json")
    stub.assert_no_pending_responses()
    # the same 403 for a key the listing does not show: S3's answer to a caller without ListBucket, i.e. missing
    client, stub = _s3()
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", 403, expected_params=denied)
    stub.add_response(
        "list_objects_v2", {"KeyCount": 0}, {"Bucket": "b", "Prefix": "p/sweep/.orch/r/status.json", "MaxKeys": 1}
    )
    with stub:
        assert S3Store("s3://b/p", client=client).get_bytes("sweep/.orch/r/status.json") is None
