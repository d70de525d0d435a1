"""The store as ssh hosts reach it (store/tunneled.py) against the controller's server (backends/ssh/server.py),
here without SSH in between (the e2e tests have the forwarded port): the Store protocol kept, one sweep's keys only,
and nothing for a holder of a wrong token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.backends.ssh.server import StoreServer
from orchestrator.store import layout
from orchestrator.store.folder import LocalStore
from orchestrator.store.tunneled import TunnelRefused, TunnelStore


@pytest.fixture
def served(tmp_path):
    store = LocalStore(str(tmp_path / "store"))
    server = StoreServer(store, "lab", tmp_path / "mirror")
    endpoint = tmp_path / "host" / "tunnel.json"
    endpoint.parent.mkdir()
    endpoint.write_text(json.dumps({"port": server.port, "token": server.token}))
    yield store, server, TunnelStore(f"tunnel:{endpoint}"), endpoint
    server.close()


def test_records_keep_their_conditional_writes(served):
    store, _, client, _ = served
    v1 = client.put_if("lab/.orch/a/status.json", b"one", None)
    assert v1 and client.put_if("lab/.orch/a/status.json", b"again", None) is None  # it exists now
    v2 = client.put_if("lab/.orch/a/status.json", b"two", v1)
    assert v2 and client.put_if("lab/.orch/a/status.json", b"late", v1) is None  # another writer came first
    assert (
        client.get_versioned("lab/.orch/a/status.json")
        == (b"two", v2)
        == store.get_versioned("lab/.orch/a/status.json")
    )
    assert client.get_bytes("lab/nothing") is None and not client.exists("lab/nothing")
    client.put_bytes("lab/x/y", b"z")
    assert client.exists("lab/x/y") and client.list("lab/x") == ["lab/x/y"]
    assert client.delete_prefix("lab/x") == 1 and store.get_bytes("lab/x/y") is None


def test_a_run_folder_syncs_both_ways_by_content(served, tmp_path):
    store, _, client, _ = served
    run = tmp_path / "run"
    (run / "ckpt" / "1").mkdir(parents=True)
    (run / "ckpt" / "1" / "w.pt").write_bytes(b"w1")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    prefix = layout.run_prefix("lab", "a")
    assert client.sync_up(run, prefix, prune=layout.is_checkpoint).copied == 2
    assert client.sync_up(run, prefix, prune=layout.is_checkpoint).copied == 0  # nothing changed
    (run / "ckpt" / "1" / "w.pt").unlink()
    (run / "ckpt" / "2").mkdir()
    (run / "ckpt" / "2" / "w.pt").write_bytes(b"w2")
    r = client.sync_up(run, prefix, prune=layout.is_checkpoint)
    assert (r.copied, r.deleted) == (1, 1)
    assert sorted(store.list(prefix)) == [f"{prefix}/ckpt/2/w.pt", f"{prefix}/metrics.jsonl"]
    fresh = TunnelStore(client.url)  # a new agent (a new attempt on another host) restores
    back = tmp_path / "back"
    got = fresh.sync_down(prefix, back, only=lambda rel: rel.startswith("ckpt/"))
    assert got.copied == 1 and (back / "ckpt" / "2" / "w.pt").read_bytes() == b"w2"
    assert not (back / "metrics.jsonl").exists()


def test_a_wrong_token_gets_nothing_and_writes_nothing(served, tmp_path):
    store, server, _, endpoint = served
    stolen = tmp_path / "stolen.json"
    stolen.write_text(json.dumps({"port": server.port, "token": "guessed"}))
    store.put_bytes("lab/secret", b"s")
    thief = TunnelStore(f"tunnel:{stolen}")
    with pytest.raises(TunnelRefused, match="401"):
        thief.get_bytes("lab/secret")
    with pytest.raises(TunnelRefused, match="401"):
        thief.put_bytes("lab/planted", b"x")
    assert store.get_bytes("lab/planted") is None


@pytest.mark.parametrize("key", ["other/.orch/a/status.json", "lab/../other/x", "lab//x", "/etc/passwd", "lab/./x"])
def test_the_token_reaches_only_its_sweeps_keys(served, tmp_path, key):
    """The agent's command can read the token (it runs as the same user): it still reaches only this sweep."""
    store, _, client, _ = served
    with pytest.raises(TunnelRefused, match="403"):
        client.put_bytes(key, b"x")
    with pytest.raises(TunnelRefused, match="403"):
        client.list(key)
    assert not list(Path(store.root).rglob("x")) and not (Path(store.root) / "other").exists()


def test_a_new_controller_is_found_through_the_endpoint_file(served, tmp_path):
    """A relaunched controller serves on another port with another token and rewrites the file: agents go on."""
    store, server, client, endpoint = served
    client.put_bytes("lab/a", b"1")
    server.close()
    again = StoreServer(store, "lab", tmp_path / "mirror")
    try:
        endpoint.write_text(json.dumps({"port": again.port, "token": again.token}))
        client.put_bytes("lab/b", b"2")
        assert store.get_bytes("lab/b") == b"2"
    finally:
        again.close()


def test_no_controller_is_an_oserror_the_agent_retries(tmp_path):
    client = TunnelStore(f"tunnel:{tmp_path / 'absent.json'}")
    with pytest.raises(OSError, match="no controller serves"):
        client.put_bytes("lab/a", b"1")


def test_a_checkpoints_manifest_reaches_the_store_after_its_files(served, tmp_path):
    """The manifest is a checkpoint's commit marker: a host lost mid-sync must not leave one naming files that never
    came (in name order `MANIFEST.json` sorts before `state.pt`)."""
    store, server, client, _ = served
    run = tmp_path / "run"
    (run / "ckpt" / "8").mkdir(parents=True)
    (run / "ckpt" / "8" / "state.pt").write_bytes(b"weights")
    (run / "ckpt" / "8" / "MANIFEST.json").write_text("{}")
    order = []
    put = server.httpd.RequestHandlerClass.do_PUT

    def spy(handler):
        order.append(handler.path.rsplit("/", 1)[-1])
        return put(handler)

    server.httpd.RequestHandlerClass.do_PUT = spy
    client.sync_up(run, layout.run_prefix("lab", "a"))
    assert order == ["state.pt", "MANIFEST.json"], order
