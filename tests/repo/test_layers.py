"""The tree shows where code runs: layers (import-linter), no import circle, a bundle that ships only the
host's side, and an `orch --help` that imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grimp

from orchestrator.backends import bundle

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("boto3", "botocore", "paramiko", "pydantic", "torch", "matplotlib", "libtmux", "rich", "yaml", "numpy")


def _cycles(graph) -> list:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 7 kept, 0 broken" in r.stdout, r.stdout


def test_no_module_imports_one_that_imports_it_back():
    graph = grimp.build_graph("orchestrator", "trainer", cache_dir=None)
    assert _cycles(graph) == []
    # The check itself sees a circle when there is one.
    graph.add_import(importer="orchestrator.errors", imported="orchestrator.cli.common")
    assert any("orchestrator.errors" in c for c in _cycles(graph))


def _face_circles(graph, root: Path) -> list:
    """(package, module): the package's `__init__` imports, directly or not, a module of its own that
    imports from the package by its name (`from orchestrator.backends import bundle`) — a circle
    through the package's face that grimp's module graph does not show."""
    import ast

    out = []
    for init in sorted((root / "orchestrator").rglob("__init__.py")):
        package = ".".join(init.relative_to(root).parent.parts)
        for module in sorted(graph.find_upstream_modules(package)):
            if not module.startswith(package + "."):
                continue
            path = root / (module.replace(".", "/") + ".py")
            if not path.exists():
                path = root / module.replace(".", "/") / "__init__.py"
            tree = ast.parse(path.read_text())
            if any(isinstance(n, ast.ImportFrom) and n.level == 0 and n.module == package for n in ast.walk(tree)):
                out.append((package, module))
    return out


def test_no_package_face_imports_a_module_that_imports_it_back():
    graph = grimp.build_graph("orchestrator", "trainer", cache_dir=None)
    assert _face_circles(graph, ROOT) == []
    # The check itself sees one: a face that imports a module that names the package.
    graph.add_import(importer="orchestrator.backends", imported="orchestrator.backends.aws.state")
    assert ("orchestrator.backends", "orchestrator.backends.aws.state") in _face_circles(graph, ROOT)


def test_the_bundle_ships_the_hosts_side_and_everything_it_imports():
    names = {name for _, name in bundle._sources(ROOT)}
    shipped = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names}
    assert "orchestrator.host.agent" in shipped and "orchestrator.store.s3" in shipped and "trainer.train" in shipped
    assert "orchestrator.host.aws.imds" in shipped  # host/'s subpackages too: the aws backend's host-side parts
    for controller_side in (
        "orchestrator.cli.main",
        "orchestrator.control.controller",
        "orchestrator.backends.aws.cloud.ec2",
        "orchestrator.backends.local",
        "orchestrator.sweep.spec",
        "orchestrator.remote.ssh",
    ):
        assert controller_side not in shipped
    graph = grimp.build_graph("orchestrator", "trainer", cache_dir=None)
    missing = {(m, i) for m in shipped for i in graph.find_modules_directly_imported_by(m) if i not in shipped}
    assert missing == set()
    # What the bundle holds is what the host runs: its entry point is in it.
    from orchestrator.contract import agent_command

    assert "-m orchestrator.host.agent " in agent_command("python3", "t.json", "ctl")


def test_orch_help_imports_nothing_heavy():
    code = (
        "import sys\nfrom orchestrator.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('MODULES', ' '.join(sorted(sys.modules)))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "orch launch" in r.stdout or "launch" in r.stdout
    loaded = set(r.stdout.split("MODULES", 1)[1].split())
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert not {m for m in loaded if m.startswith(("orchestrator.control", "orchestrator.backends"))}


def test_the_documented_policy_is_the_one_orch_prints(orch):
    import json

    from orchestrator.backends.aws.cloud.policy import boundary_policy, controller_policy

    page = (ROOT / "docs" / "aws.md").read_text().split("## The IAM permissions orch needs", 1)[1]
    shown = json.loads(page.split("```json\n", 1)[1].split("```", 1)[0])
    assert shown == controller_policy()
    boundary = page.split("The boundary (`orch aws boundary`)", 1)[1]
    assert json.loads(boundary.split("```json\n", 1)[1].split("```", 1)[0]) == boundary_policy()
    r = orch("aws", "policy", "--bucket", "my-bucket")
    assert r.code == 0 and json.loads(r.out) == controller_policy("my-bucket"), r.out + r.err
    assert "arn:aws:s3:::my-bucket/*" in r.out and "ec2:CreateImage" in r.out and "ec2:StopInstances" not in r.out
    r = orch("aws", "policy", "--bucket", "my-bucket", "--data-bucket", "data-1", "--data-bucket", "data-2")
    assert r.code == 0 and json.loads(r.out) == controller_policy("my-bucket", ["data-1", "data-2"]), r.out + r.err
    assert "arn:aws:s3:::data-2/*" in r.out
    r = orch("aws", "boundary", "--bucket", "my-bucket", "--data-bucket", "data-1")
    assert r.code == 0 and json.loads(r.out) == boundary_policy("my-bucket", ["data-1"]), r.out + r.err
    bad = orch("aws", "policy", "--bucket", "s3://my-bucket/x")
    assert bad.code == 2 and "not a bucket name" in bad.err and "Traceback" not in bad.err


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = Path(sys.executable).with_name("ruff")
    return subprocess.run([str(ruff), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_tree_is_ruff_formatted_and_lint_clean():
    """pyproject's [tool.ruff] is the house style: `ruff format` changes nothing and `ruff check` finds nothing."""
    fmt = _ruff("format", "--check", ".")
    assert fmt.returncode == 0, f"run `ruff format .`:\n{fmt.stdout}{fmt.stderr}"
    lint = _ruff("check", ".")
    assert lint.returncode == 0, f"`ruff check .` found:\n{lint.stdout}{lint.stderr}"


def private_imports(root: Path) -> list:
    """Every `from orchestrator.x import _name` in a module other than x (a private name is its module's own)."""
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator")):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__") and node.module != module:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name(tmp_path):
    """A name with a leading underscore may change without notice: what another module needs is made public."""
    assert private_imports(ROOT / "orchestrator") == []
    planted = tmp_path / "orchestrator"  # the check finds one, at module level and inside a function
    planted.mkdir()
    (planted / "a.py").write_text("from orchestrator.b import _x\n\n\ndef f():\n    from orchestrator.c import _y, z\n")
    assert private_imports(planted) == [
        "orchestrator/a.py:1: orchestrator.b._x",
        "orchestrator/a.py:5: orchestrator.c._y",
    ]


def test_pyright_finds_no_type_errors_in_orchestrator():
    pyright = Path(sys.executable).with_name("pyright")
    r = subprocess.run(
        [str(pyright), "--outputjson", "--pythonpath", sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    report = json.loads(r.stdout)
    errors = [
        f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert report["summary"]["filesAnalyzed"] > 50, r.stdout[-2000:]
    assert errors == [], f"{len(errors)} type errors:\n" + "\n".join(errors)
