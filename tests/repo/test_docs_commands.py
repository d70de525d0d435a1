"""Every shell block of orch in README.md and docs/ that is marked `<!-- run-by: tests/repo/test_docs_commands.py -->`
runs here as written, each line exiting 0, in a sandbox: a fresh ORCH_HOME and working folder holding the
repository's experiments/ (the example sweeps the pages use), no AWS credentials, and every AWS endpoint pointed at
a closed loopback port, so a block that would need AWS fails here instead of reaching it. A block marked
`tested-by: FILE::TEST` names a test that pytest collects. (tests/repo/test_docs_site.py checks that every such
block carries one of the marks.)"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.repo.test_docs_site import MARK, ORCH_LINE, doc_files, shell_blocks

THIS = "tests/repo/test_docs_commands.py"


def marked_blocks() -> list[tuple[str, re.Match, str]]:
    """(where, its mark, the block) for every shell block of orch that carries a mark."""
    found = []
    for doc in doc_files():
        name = str(doc.relative_to(ROOT))
        for line, before, block in shell_blocks(doc.read_text()):
            mark = MARK.search(before)
            if ORCH_LINE.search(block) and mark:
                found.append((f"{name}:{line}", mark, block))
    return found


RUN_HERE = [(where, block) for where, mark, block in marked_blocks() if mark.group("reader") == THIS]


def commands(block: str) -> list[str]:
    """The block's command lines, comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", block)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in text.splitlines()]
    return [line.removeprefix("$ ") for line in lines if line and not line.startswith("#")]


@pytest.fixture
def sandbox(tmp_path) -> tuple[Path, dict[str, str]]:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "experiments").symlink_to(ROOT / "experiments")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # `orch` as the docs type it, run from this checkout's code (not whichever orch the venv installed).
    (bindir / "orch").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m orchestrator.cli "$@"\n')
    (bindir / "orch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PATH=f"{bindir}:{env['PATH']}",
        PYTHONPATH=str(ROOT),
        ORCH_HOME=str(tmp_path / "home"),
        HOME=str(tmp_path / "userhome"),
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_ENDPOINT_URL="http://127.0.0.1:9",
    )
    return cwd, env


def test_the_docs_have_blocks_this_test_runs_on_the_quickstart_and_admin_pages():
    pages = {where.split(":")[0] for where, _ in RUN_HERE}
    assert {"docs/getting-started/quickstart.md", "docs/getting-started/admin.md"} <= pages, pages


@pytest.mark.parametrize(("where", "block"), RUN_HERE, ids=[where for where, _ in RUN_HERE])
def test_a_block_marked_run_by_this_test_runs_as_written_in_a_sandbox(where, block, sandbox):
    cwd, env = sandbox
    lines = commands(block)
    assert lines, f"{where}: a block with no command"
    for line in lines:
        assert line.startswith("orch "), f"{where}: `{line}` is not a command of orch; mark the block not-run"
        done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where}: `{line}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def test_every_test_a_block_names_as_tested_by_is_collected_by_pytest():
    named = sorted(
        {f"{mark.group('test')}::{mark.group('name')}" for _, mark, _ in marked_blocks() if mark.group("test")}
    )
    assert named
    done = subprocess.run(
        # Their files, not the node ids: one id pytest cannot find would make it collect nothing at all.
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + sorted({node.split("::")[0] for node in named}),
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=240,  # collection takes ~20 s; under the 300 s test limit with its margin
    )
    collected = {node.split("[")[0] for node in done.stdout.split()}  # a parametrized test by its name
    missing = [node for node in named if node not in collected]
    output = f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert not missing, f"docs name tests pytest does not collect: {missing}\n{output}"
