"""A sweep's records in the store are input: a damaged sweep.json or notify.json is refused or reported — what is wrong,
where, the fix — by launch, status, collect and down, never taken as absent and never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import finish

pytestmark = pytest.mark.slow

SWEEP = "name: dmg\ncommand: '{cmd}'\ngrid:\n  x: [1]\nstore: store\n"


def damage(record, kind: str) -> None:
    good = json.loads(record.read_text())
    record.unlink()
    if kind == "directory":
        record.mkdir()
        return
    text = {
        "truncated": json.dumps(good)[:40],
        "garbage": "\x00\x01 not json",
        "a list": "[1, 2, 3]",
        "spec not an object": json.dumps({**good, "spec": 5}),
        "a field of the wrong type": json.dumps({**good, "spec": {**good["spec"], "max_parallel": "many"}}),
    }[kind]
    record.write_text(text)


KINDS = ["truncated", "garbage", "a list", "directory", "spec not an object", "a field of the wrong type"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_sweep_json_is_refused_by_every_command_with_its_place_and_the_fix(orch, kind):
    path = orch.sweep(SWEEP.format(cmd="true"))
    assert finish(orch, path).code == 0
    record = orch.tmp / "store" / "dmg" / "sweep.json"
    damage(record, kind)
    marker = orch.tmp / "changed-ran"
    path.write_text(SWEEP.format(cmd=f"touch {marker}"))  # a changed command: must not run in the old sweep's folder
    for args in (["launch", str(path)], ["launch", str(path), "--dry-run"]):
        r = orch(*args)
        assert r.code == 2 and "Traceback" not in r.err, (args, r.out, r.err)
        assert ("sweep.json" in r.err and "Fix:" in r.err) or "different sweep" in r.err, (args, r.err)
    assert not marker.exists()
    for args in (["status", "dmg"], ["collect", "dmg"], ["down", "dmg"]):
        r = orch(*args)
        assert r.code == 2 and "Traceback" not in r.err and "sweep.json" in r.err, (args, r.out, r.err)
    listed = orch("status")
    assert listed.code == 0 and "dmg" in listed.out and "unreadable" in listed.out, listed.out + listed.err
    by_file = orch("down", str(path))  # what the error says stops it meanwhile
    assert by_file.code == 0 and "Traceback" not in by_file.err, by_file.err


@pytest.mark.parametrize(
    "text", ['{"sinks": {"a": {"label": 1, "tries_failed": "x"}}}', '{"messages": {"k": {"to": {"s": "x"}}}}', None]
)
def test_a_damaged_notify_json_is_reported_by_status_not_a_traceback(orch, text):
    path = orch.sweep(SWEEP.format(cmd="true"))
    assert finish(orch, path).code == 0
    outbox = orch.tmp / "store" / "dmg" / "notify.json"
    if text is None:
        outbox.mkdir()
    else:
        outbox.write_text(text)
    r = orch("status", "dmg")
    assert r.code == 0 and "Traceback" not in r.err, r.out + r.err
    assert str(outbox) in r.out and "move it aside" in r.out, r.out
    for args in (["collect", "dmg"], ["down", "dmg"]):
        other = orch(*args)
        assert other.code == 0 and "Traceback" not in other.err, (args, other.err)
    if outbox.is_dir():
        shutil.rmtree(outbox)
