"""What docs/getting-started/first-aws-sweep.md tells a user to install before `python -m tests.fakecloud` is enough:
every package the fake cloud imports (at start or later, lazily) comes with orch or with the extra the page names."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")


def imported_by(module: str, seen: set | None = None) -> set:
    """Top-level names of what `module` (a tests.* module) imports, following the tests.* modules it imports."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    path = ROOT.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names: set = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            targets = [node.module]
        for target in targets:
            if target.startswith("tests."):
                names |= imported_by(target, seen)
            else:
                names.add(target.split(".")[0])
    if module.count(".") > 1 or module.endswith("__main__"):  # importing a.b.c runs a.b's __init__ first
        names |= imported_by(module.rsplit(".", 1)[0], seen)
    return names


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: list[str]) -> set:
    """The distributions these requirements install, with what they require in turn (extras and markers honoured)."""
    found: set = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        key = (name, tuple(sorted(req.extras)))
        if key in found:
            continue
        found.add(key)
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(sub)
    return {name for name, _ in found}


def test_the_fakecloud_extra_holds_everything_python_m_tests_fakecloud_imports():
    page = (ROOT / "docs" / "getting-started" / "first-aws-sweep.md").read_text()
    assert "scripts/setup.sh trainer,fakecloud" in page.split("```bash\n.venv/bin/python -m tests.fakecloud")[0]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = closure(project["dependencies"] + project["optional-dependencies"]["fakecloud"])
    by_module = metadata.packages_distributions()
    third_party = imported_by("tests.fakecloud.__main__") - set(sys.stdlib_module_names) - {"orchestrator", "tests"}
    assert "moto" in third_party  # the check sees the lazy imports inside functions, not only the module's head
    missing = {top: by_module.get(top, [top]) for top in sorted(third_party)}
    missing = {top: dists for top, dists in missing.items() if not {_norm(d) for d in dists} & installed}
    assert not missing, f"python -m tests.fakecloud imports these; neither orch nor orch[fakecloud] has them: {missing}"


def test_the_check_sees_a_package_that_only_the_test_extras_install():
    assert "pytest" in imported_by("tests.fakecloud.sweeps")  # through tests.conftest
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "pytest" not in closure(project["dependencies"] + project["optional-dependencies"]["fakecloud"])


def imported_by_package(root: str) -> set:
    """Top-level names every module of a package imports (lazy imports inside functions too)."""
    names: set = set()
    for path in sorted((ROOT / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


# what orch imports only for a feature whose extra the docs name (`orch tensorboard`: the board extra)
EXTRA_ONLY = {"tensorboard": "board"}


def test_orch_itself_runs_on_its_base_dependencies():
    """`pip install orch` (the quickstart installs it with the trainer, which adds nothing orch imports) must run
    every command: each package orchestrator/ imports comes with orch's own dependencies (`pathspec` came only with
    mkdocs, a dev extra: a quickstart's `orch launch` would have failed on `workdir:`)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = closure(project["dependencies"])
    by_module = metadata.packages_distributions()
    third_party = imported_by_package("orchestrator") - set(sys.stdlib_module_names) - {"orchestrator", "trainer"}
    assert "pathspec" in third_party and "boto3" in third_party  # lazy imports are seen
    missing = {top: by_module.get(top, [top]) for top in sorted(third_party) if top not in EXTRA_ONLY}
    missing = {top: dists for top, dists in missing.items() if not {_norm(d) for d in dists} & installed}
    assert not missing, f"orchestrator/ imports these; orch's base dependencies do not install them: {missing}"
