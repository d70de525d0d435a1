"""The store's layout is one module's (orchestrator/store/layout.py): every key is spelled there, and
the parsers of its listings give back what its builders made; a run that writes its own status.json writes a file,
never orch's record."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.store import layout
from tests.conftest import finish
from tests.conftest import run_states as status

ROOT = Path(__file__).resolve().parents[3]
# Names and folders of the store's layout: a string without spaces holding one is a key (a message
# that names a file in prose has spaces and is left alone).
KEY_PARTS = (
    "sweep.json",
    "status.json",
    "summary.json",
    "rungs.json",
    "cost.json",
    "controller.json",
    "metrics.jsonl",
    "MANIFEST.json",
    "/.orch",
    ".orch/",
    ".orch-touched",
    "node-logs",
    "node-exits",
    "ckpt/",
    "/ckpt",
)


def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _literal(node: ast.AST) -> str:
    """A string's text, with `{}` for each formatted value of an f-string."""
    if isinstance(node, ast.Constant):
        return node.value
    return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def _sweep_first(node: ast.JoinedStr) -> bool:
    """f"{<a sweep's name>}/<literal>...": a key built by hand from a sweep's name."""
    if len(node.values) < 2 or not isinstance(node.values[0], ast.FormattedValue):
        return False
    value, rest = node.values[0].value, node.values[1]
    head = ast.unparse(value)
    return (
        isinstance(value, (ast.Name, ast.Attribute))
        and ("sweep" in head or head.endswith("name"))
        and isinstance(rest, ast.Constant)
        and rest.value.startswith("/")
        and len(rest.value) > 1
    )


def spelled_keys(root: Path) -> list[str]:
    """`path:line: text` of every string outside orchestrator/store/ that spells a store key."""
    found = []
    for path in sorted((root / "orchestrator").rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[:2] == ("orchestrator", "store"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in skip or id(node) in inner:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str) or isinstance(node, ast.JoinedStr):
                text = _literal(node)
                named = not any(c.isspace() for c in text) and any(p in text for p in KEY_PARTS)
                if named or (isinstance(node, ast.JoinedStr) and _sweep_first(node)):
                    found.append(f"{rel}:{node.lineno}: {text}")
    return found


def test_no_store_key_is_spelled_outside_the_store_package():
    found = spelled_keys(ROOT)
    assert not found, "store keys belong in orchestrator/store/layout.py; spelled elsewhere:\n" + "\n".join(found)


def test_the_scan_sees_a_key_spelled_by_hand(tmp_path):
    pkg = tmp_path / "orchestrator" / "control"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        '"""Reads <sweep>/summary.json."""\n'
        'a = f"{sweep}/summary.json"\n'
        'b = f"{self.name}/{rid}/metrics.jsonl"\n'
        'c = name + "/.orch/" + run\n'
        'd = f"{spec.name}/rungs.json is gone, so nothing was pruned"\n'
        'e = f"{sweep.spec.name}/{run_id} already done"\n'
        'f = "the sweep.json of this sweep"\n'
    )
    found = spelled_keys(tmp_path)
    assert sorted(int(line.split(":")[1]) for line in found) == [2, 3, 4, 5], found


def test_listings_parse_back_to_what_the_builders_made():
    keys = [layout.status_key("sw", r) for r in ("a", "b=1,c=2")] + [layout.log_key("sw", "a", 1)]
    assert layout.recorded("sw", keys) == {"a", "b=1,c=2"}
    assert layout.touched_runs("sw", [layout.touched_key("sw", "a"), layout.touched_key("other", "b")]) == ["a"]
    ckpt = layout.checkpoints_prefix("sw", "a")
    listing = [
        f"{ckpt}/12/{layout.MANIFEST_FILE}",
        f"{ckpt}/12/model.pt",
        f"{ckpt}/30/model.pt",
        f"{ckpt}/x/MANIFEST.json",
    ]
    assert layout.manifested_steps("sw", "a", listing) == {12}
    assert layout.checkpoint_rel(12) == "ckpt/12/" and layout.is_checkpoint("ckpt/12/model.pt")
    assert not layout.is_checkpoint(layout.METRICS_FILE)


def test_node_logs_live_apart_from_node_zeros():
    assert layout.log_key("sw", "r", 3) == f"{layout.logs_prefix('sw', 'r')}/3.log"
    assert layout.log_key("sw", "r", 3, node=2) == f"{layout.node_logs_prefix('sw', 'r', 2)}/3.log"
    assert layout.status_key("sw", "r").startswith(layout.records_prefix("sw", "r") + "/")
    assert not layout.metrics_key("sw", "r").startswith(layout.records_prefix("sw", "r"))


@pytest.mark.slow
def test_a_run_writing_status_json_is_just_a_file(orch):
    path = orch.sweep("""
        name: mine
        command: "D=$ORCH_RUN_DIR;echo '{{\\"state\\": null}}' >$D/status.json; mkdir -p $D/logs; echo x >$D/logs/1.log"
        grid:
          a: [1, 2, 3]
        max_parallel: 1
        store: store
    """)
    r = finish(orch, path)
    assert r.code == 0, r.out + r.err
    assert all(v["state"] == "succeeded" for v in status(orch, "mine").values())
    assert orch("collect", "mine").code == 0
