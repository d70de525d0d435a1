"""A test's own limits agree: no wait inside a test may outlast the pytest timeout that kills it.

When they disagree the outer limit wins on a slow machine and the test dies in the middle of a launch,
leaving instances and groups for the teardown to find; the inner limit was the one meant.
"""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parents[1]
MARGIN_S = 20  # fixtures, teardown and the last poll need a little of the test's time too


def _default_timeout() -> int:
    text = (TESTS.parent / "pyproject.toml").read_text()
    return int(re.search(r"^timeout = (\d+)", text, re.M).group(1))


def _mark_timeout(decorators) -> int:
    for d in decorators:
        if isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.timeout" and d.args:
            return int(ast.literal_eval(d.args[0]))
    return 0


def _module_timeout(tree: ast.Module) -> int:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            found = _mark_timeout(marks)
            if found:
                return found
    return 0


def _helper_defaults(tree: ast.Module) -> dict[str, float]:
    """The module's own helpers that wait (`def run_trainer(args, timeout=300)`): a call that gives no
    timeout waits as long as the helper's default."""
    found = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            params = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :] + fn.args.kwonlyargs
            defaults = list(fn.args.defaults) + list(fn.args.kw_defaults)
            for param, default in zip(params, defaults):
                if param.arg in ("timeout", "timeout_s") and isinstance(default, ast.Constant):
                    found[fn.name] = float(default.value)
    return found


def _helper_wait(node: ast.Call, helpers: dict[str, float]):
    """How long a call of a module helper waits: the timeout it gives, else the helper's default; None for any
    other call (or a timeout that is not a number written out)."""
    name = ast.unparse(node.func)
    if name not in helpers:
        return None
    given = [kw.value for kw in node.keywords if kw.arg in ("timeout", "timeout_s")]
    if not given:
        return helpers[name]
    return (
        float(given[0].value)
        if isinstance(given[0], ast.Constant) and isinstance(given[0].value, (int, float))
        else None
    )


def _inner_limits(fn: ast.FunctionDef, helpers: dict[str, float]):
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            if ast.unparse(node.func) in helpers and not any(
                kw.arg in ("timeout", "timeout_s") for kw in node.keywords
            ):
                yield node.lineno, _helper_wait(node, helpers)  # the helper's own default (a given one: below)
            positional = node.args[1] if ast.unparse(node.func) == "retry_until" and len(node.args) > 1 else None
            if isinstance(positional, ast.Constant) and isinstance(positional.value, (int, float)):
                yield node.lineno, float(positional.value)  # retry_until(fn, timeout, interval, what)
            for kw in node.keywords:
                if kw.arg in ("timeout", "timeout_s") and isinstance(kw.value, ast.Constant):
                    if isinstance(kw.value.value, (int, float)):
                        yield node.lineno, float(kw.value.value)


def _helper_runs(fn: ast.FunctionDef, helpers: dict[str, float]) -> list[float]:
    """How long each call of a module helper in the test may wait. Such helpers run a program to its end
    (a trainer run), one after another, so their waits add up: two runs of 200 s do not fit in 300 s."""
    waits = (_helper_wait(node, helpers) for node in ast.walk(fn) if isinstance(node, ast.Call))
    return [w for w in waits if w is not None]


def limits_that_disagree(path: Path):
    tree = ast.parse(path.read_text())
    default = _module_timeout(tree) or _default_timeout()
    helpers = _helper_defaults(tree)
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
            limit = _mark_timeout(fn.decorator_list) or default
            for line, inner in _inner_limits(fn, helpers):
                if inner > limit - MARGIN_S:
                    yield f"{path.name}:{line}: {fn.name} waits up to {inner:g} s inside a {limit} s test limit"
            runs = _helper_runs(fn, helpers)
            if len(runs) > 1 and sum(runs) > limit - MARGIN_S:
                total = f"{len(runs)} helpers for up to {sum(runs):g} s in all"
                yield f"{path.name}:{fn.lineno}: {fn.name} runs {total} inside a {limit} s test limit"


def test_no_wait_in_a_test_outlasts_the_test_itself():
    bad = [msg for path in sorted(TESTS.rglob("test_*.py")) for msg in limits_that_disagree(path)]
    assert not bad, "raise the test's @pytest.mark.timeout above its longest wait:\n" + "\n".join(bad)


def test_the_scan_sees_a_launch_that_outlasts_its_test(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n\n"
        "def test_a(orch):\n    orch('launch', 'x', timeout=600)\n\n"
        "@pytest.mark.timeout(900)\ndef test_b(orch):\n    orch('launch', 'x', timeout=600)\n\n"
        "def test_c(orch):\n    retry_until(lambda: True, 600, 1.0, 'the run to end')\n\n"
        "def train(args, timeout=300):\n    pass\n\n"
        "def test_d():\n    train([])\n\n"
        "def test_e():\n    train([], timeout=60)\n\n"
        "def test_f():\n    train([], timeout=200)\n    train([], timeout=200)\n"
    )
    assert [m.split(": ")[1] for m in limits_that_disagree(sample)] == [
        "test_a waits up to 600 s inside a 300 s test limit",
        "test_c waits up to 600 s inside a 300 s test limit",  # (a wait through retry_until's own argument)
        "test_d waits up to 300 s inside a 300 s test limit",  # (a wait through a helper's default)
        "test_f runs 2 helpers for up to 400 s in all inside a 300 s test limit",  # (waits one after another)
    ]
