"""The agent counts the bytes each attempt moves to and from the store (status.json's `moved`): what prices the
inter-region transfer of a run outside the store's region (docs/guides/costs.md)."""

from __future__ import annotations

import pytest

from orchestrator.store.status import read_status

pytestmark = pytest.mark.slow


def test_the_agent_counts_the_bytes_each_attempt_moved_to_the_store(orch, script):
    blob = 3 * 1024 * 1024
    job = script(f"""
        import os
        open(os.path.join(os.environ["ORCH_RUN_DIR"], "ckpt.bin"), "wb").write(b"x" * {blob})
    """)
    path = orch.sweep(f"""
        name: moved
        command: "{{python}} {job}"
        store: store
    """)
    r = orch("launch", str(path))
    assert r.code == 0, r.out + r.err
    from orchestrator.store.folder import LocalStore

    status = read_status(LocalStore(path.parent / "store"), "moved", "run")
    up, down = status.moved["1"]
    assert blob <= up < blob + 64 * 1024, status.moved  # the file, plus the log and the sync index
    # down: `workdir:`'s snapshot (this test's folder), fetched once on this host
    import json

    code = json.loads((path.parent / "store" / "moved" / "sweep.json").read_text())["code"]
    assert down == code["archive_bytes"] > 0, (status.moved, code)
