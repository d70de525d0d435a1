"""The fake-cloud walk-through of docs/getting-started/first-aws-sweep.md (once in the README), run as written:
`python -m tests.fakecloud` in one process (it used to crash at start), its exports pasted into another, then the
block's commands one by one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import uuid

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def walkthrough_commands() -> list:
    page = (ROOT / "docs" / "getting-started" / "first-aws-sweep.md").read_text()
    after = page.split("**Try it without AWS.**", 1)[1]
    # the walkthrough's block is the one that starts the fake cloud (a set-up block may come before it)
    block = next(b.split("```", 1)[0] for b in after.split("```bash\n")[1:] if "-m tests.fakecloud" in b)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    cloud = [line for line in lines if "-m tests.fakecloud" in line]
    rest = [line for line in lines if line and not line.startswith("#") and "-m tests.fakecloud" not in line]
    assert cloud == [".venv/bin/python -m tests.fakecloud"] and rest, block
    return rest


@pytest.mark.timeout(900)
def test_the_fake_cloud_walkthrough_of_the_docs_runs_as_written(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    (work / "experiments").symlink_to(ROOT / "experiments")  # the commands name experiments/...; results/ lands here
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(home),
        ORCH_HOME=str(tmp_path / "orch-home"),
        ORCH_TMUX_SOCKET=f"walk-{uuid.uuid4().hex[:6]}",
        PATH=f"{ROOT / '.venv' / 'bin'}:{os.path.dirname(sys.executable)}:{env.get('PATH', '')}",
        COLUMNS="200",
        PYTHONPATH=str(ROOT),
    )
    cloud = subprocess.Popen(
        [sys.executable, "-m", "tests.fakecloud"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        exports, seen = {}, []
        for line in cloud.stdout:
            seen.append(line)
            m = re.match(r"^\s+export (\w+)=(.*)$", line)
            if m:
                exports[m.group(1)] = m.group(2)
            if "subnets:" in line:
                break
        assert "AWS_ENDPOINT_URL" in exports, "".join(seen)
        threading.Thread(target=lambda: seen.extend(cloud.stdout), daemon=True).start()  # never let its pipe fill
        shell_env = {**env, **exports}
        for command in walkthrough_commands():
            r = subprocess.run(
                ["bash", "-c", command], cwd=work, env=shell_env, capture_output=True, text=True, timeout=600
            )
            assert r.returncode == 0, f"{command}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            assert "Traceback" not in r.stderr, r.stderr
            if "--dry-run" in command:
                assert "estimated cost" in r.stdout and "nothing launched" in r.stdout, r.stdout
            elif (
                "launch experiments/fakecloud-budget.yaml" in command
            ):  # the first runs spend the budget; the others never start
                assert re.search(
                    r"cancelled \(attempt \d\) \(not started: budget \$0\.0010 reached \(spent \$0\.\d{4}\)", r.stdout
                ), r.stdout
                assert re.search(r"done: [12] of 4 runs succeeded, spent \$\d+\.\d+ of budget \$0\.0010", r.stdout), (
                    r.stdout
                )
            elif "collect fakecloud-smoke" in command:  # fake dollars, and the target's summary line
                assert "target: " in r.stdout and "Spent $0.0" in r.stdout, r.stdout
        assert (work / "results" / "fakecloud-smoke" / "runs.csv").exists()
        assert any("fakecloud-budget" in c for c in walkthrough_commands())
    finally:
        cloud.send_signal(signal.SIGINT)
        try:
            cloud.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cloud.kill()
