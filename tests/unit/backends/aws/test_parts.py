"""The aws backend is composed, not mixed in: its parts (provision.py, pack.py) are classes that share only the
ProvisioningState (and the Provisioner) they are given, so no attribute is shared by convention."""

from __future__ import annotations

import ast
from pathlib import Path

AWS = Path(__file__).resolve().parents[4] / "orchestrator" / "backends" / "aws"
GIVEN = {"state", "provisioner"}  # what a part is handed in its __init__


def _borrowed(source: str):
    """(class, attribute) for each `self.<attribute>` a class reads or writes that is neither handed to it nor one
    of its own methods."""
    for cls in ast.walk(ast.parse(source)):
        if isinstance(cls, ast.ClassDef):
            own = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    if node.attr not in GIVEN | own:
                        yield cls.name, node.attr


def _mixed_in(source: str):
    """(class, base) for each base class but the Backend interface's defaults and the sweep file's model base (the
    settings section and the recipe): a mixin brings attributes along."""
    for cls in ast.walk(ast.parse(source)):
        if isinstance(cls, ast.ClassDef):
            yield from (
                (cls.name, ast.unparse(b)) for b in cls.bases if ast.unparse(b) not in ("BackendBase", "Strict")
            )


def test_the_provisioning_parts_share_only_the_state_they_are_given():
    found = [f"{p.name}: {c}.{a}" for p in (AWS / "provision.py", AWS / "pack.py") for c, a in _borrowed(p.read_text())]
    assert not found, "share provisioning state through ProvisioningState (state.py), explicitly:\n" + "\n".join(found)
    mixed = [f"{p.name}: {c}({b})" for p in sorted(AWS.glob("*.py")) for c, b in _mixed_in(p.read_text())]
    assert not mixed, "compose the aws backend's parts, do not mix them in:\n" + "\n".join(mixed)


def test_the_check_finds_a_mixin_and_an_attribute_shared_by_convention():
    bad = (
        "class PackMixin:\n"
        "    def place(self):\n"
        "        return self.pack_lock, self.state, self._free_slot()\n"
        "    def _free_slot(self):\n"
        "        return None\n"
        "class AwsBackend(PackMixin, BackendBase):\n"
        "    pass\n"
    )
    assert list(_borrowed(bad)) == [("PackMixin", "pack_lock")]
    assert list(_mixed_in(bad)) == [("AwsBackend", "PackMixin")]
