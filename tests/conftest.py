"""Shared fixtures: a private ORCH_HOME, a private tmux server (torn down by socket), the real CLI."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

# Two test workers share two cores, and each trainer they start would take one OpenMP thread per core: the
# threads then busy-wait on each other and a digits run takes ten times its CPU (measured: 58 s for 5 s). One
# thread each, unless a test asks for more; set before anything imports torch.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


# The longest tests (minutes each, mostly waiting on fake boots, leases and real training) start first, so the
# workers share them instead of one worker ending the suite alone with the last of them. The 30 slowest of a
# fresh-clone run (stop 53, `scripts/test.sh --durations=30`), longest first, two that mostly wait (on leases,
# boots, capacity) taking turns with two that mostly compute (training): xdist hands each worker two tests at
# first, so each worker starts on one kind and the cores are neither idle while every worker waits nor crowded
# while every worker trains. A test renamed or added later is ordered as the other `slow` ones are.
LONGEST_FIRST = (
    "test_a_killed_supervisor_is_restarted_and_with_everything_killed_the_watchdog_ends_the_instance",
    "test_the_controller_terminates_its_own_instance_at_max_hours",
    "test_every_run_interrupted_once_finishes_with_uninterrupted_results",
    "test_two_nodes_of_two_processes_interrupted_on_node_1_end_as_one_node_of_four",
    "test_acceptance_three_runs_with_realistic_boot_use_exactly_three_instances",
    "test_a_run_longer_than_the_time_limit_finishes_across_jobs",
    "test_a_lost_controller_instance_is_reported_and_a_second_remote_adopts_the_runs",
    "test_host_lost_without_notice_resumes",
    "test_compile_trains_and_matches_eager_closely",
    "test_a_quota_reached_while_runs_go_makes_runs_wait_not_the_sweep_fail",
    "test_controller_killed_right_after_createfleet_is_adopted",
    "test_a_reclaimed_shared_instance_resumes_its_runs_in_another_region",
    "test_four_ranks_resumed_mid_epoch_reduce_as_the_run_they_continue",
    "test_the_fake_cloud_walkthrough_of_the_docs_runs_as_written",
    "test_terminated_instances_still_counting_toward_a_quota_make_the_next_run_wait_not_the_sweep_fail",
    "test_a_run_interrupted_in_one_region_resumes_in_another_from_its_checkpoint",
    "test_ddp_run_interrupted_by_a_notice_resumes_bitwise",
    "test_sweep_runs_on_fake_spot_instances_and_leaves_nothing",
    "test_a_crashed_remote_controller_is_restarted_by_its_supervisor_and_takes_its_own_lease_at_once",
    "test_digits_preset_reaches_97_percent",
    "test_four_one_gpu_runs_share_one_four_gpu_instance_and_resume_together",
    "test_an_agent_that_goes_silent_loses_its_host_and_the_run_restarts",
    "test_remote_controller_resumes_an_interrupted_run_while_the_laptop_sleeps_and_ends_itself",
    "test_the_speed_table_command_runs_every_row_and_names_what_cannot_run",
    "test_a_search_with_prune_and_target_runs_its_trials_in_the_next_region",
    "test_a_remote_controller_restarted_by_its_supervisor_is_told_once",
    "test_an_attempt_ended_by_a_failed_node_keeps_every_nodes_log_and_the_run_folder",
    "test_a_node_whose_command_fails_fails_the_attempt_and_counts_against_max_restarts",
    "test_two_process_torchrun_lands_in_the_same_band",
    "test_nodes_come_all_at_once_and_a_lost_node_ends_the_attempt_on_every_node",
    "test_fast_muon_resumed_mid_epoch_ends_with_the_weights_of_a_run_never_stopped",
)


def pytest_collection_modifyitems(config, items):
    """Known-long tests first, then the other `slow` ones (a stable sort: the rest keep their order)."""

    def rank(item) -> int:
        known = next((i for i, name in enumerate(LONGEST_FIRST) if item.name.startswith(name)), None)
        if known is not None:
            return known
        return len(LONGEST_FIRST) + (item.get_closest_marker("slow") is None)

    items.sort(key=rank)


LOG_TAIL_LINES = 60  # of each log a failed test's report shows


def _log_tails(tmp: Path) -> str:
    """The last lines of every controller's and agent's log under a test's tmp folder (what a CI failure needs to be
    read without the machine it ran on)."""
    logs = [
        log
        for pattern in (
            "orch-home/logs/*.log",
            "orch-home/work/*/*/ctl/agent.log",
            "cloud/hosts/*/home/orch/runs/*/*/ctl/agent.log",
        )
        for log in sorted(tmp.glob(pattern))
    ]
    parts = []
    for log in logs[:24]:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        parts.append(f"--- {log.relative_to(tmp)} (last {LOG_TAIL_LINES} of {len(lines)} lines)")
        parts.extend(line[:300] for line in lines[-LOG_TAIL_LINES:] if "paramiko.transport" not in line)
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran sweeps carries their logs' tails in its report."""
    outcome = yield
    report = outcome.get_result()
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if report.failed and call.when == "call" and isinstance(tmp, Path):
        tails = _log_tails(tmp)
        if tails:
            report.sections.append(("sweep logs (tails)", tails))


@pytest.fixture(autouse=True, scope="session")
def _never_real_aws():
    """Fail closed: a test may only ever talk to an AWS endpoint on loopback."""
    url = os.environ.get("AWS_ENDPOINT_URL")
    if url:
        host = urlparse(url).hostname or ""
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            pytest.exit(f"AWS_ENDPOINT_URL={url} is not loopback; refusing to run tests", returncode=3)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


STATUS_GAP_S = 2.0  # run_states: at least this long between two `orch status` calls of one test
# A wait for a state that lasts (a run's end, its second attempt) asks every ENDED_GAP_S: such a wait of two minutes
# made 60 calls of about 0.9 s of CPU each at STATUS_GAP_S; at this gap it makes 24 and sees the end at most 5 s later.
ENDED_GAP_S = 5.0


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def _still_running(args, timeout: float, out: str, err: str) -> AssertionError:
    return AssertionError(
        f"orch {' '.join(args)} still running after {timeout:.0f} s; its output and stacks:\n"
        f"{out[-3000:]}\n{err[-12000:]}"
    )


class Orch:
    """The real `orch` CLI in a private home, with its own tmux socket."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.home = tmp / "orch-home"
        self.socket = f"orch-test-{uuid.uuid4().hex[:8]}"
        self.env = dict(os.environ, ORCH_HOME=str(self.home), ORCH_TMUX_SOCKET=self.socket, COLUMNS="200")
        self.env.pop("TMUX", None)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        self.last_status = 0.0  # (monotonic) when run_states last returned

    def argv(self, *args: str):
        return [sys.executable, "-X", "faulthandler", "-m", "orchestrator.cli", *args]

    def __call__(self, *args: str, timeout: float = 280, cwd: Path | None = None) -> CliResult:
        """The CLI to its end. One that outlives `timeout` (by default under pytest's own 300 s) is stopped with
        SIGABRT, so Python's faulthandler prints every thread's stack: the failure shows where it hung and what it
        logged. Forked from the worker's fork server when it fits (tests/zygote.py says why and how)."""
        from tests.zygote import zygote_for

        zygote = zygote_for(self.env)
        if zygote is not None:
            code, out, err, stuck = zygote.run(args, self.env, cwd or self.tmp, timeout)
            if stuck:
                raise _still_running(args, timeout, out, err)
            return CliResult(code, out, err)
        p = subprocess.Popen(
            self.argv(*args),
            env=self.env,
            cwd=cwd or self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            out, err = p.communicate()
            raise _still_running(args, timeout, out, err) from None
        return CliResult(p.returncode, out, err)

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            self.argv(*args),
            env=self.env,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **kw,
        )

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=self.env)

    @contextlib.contextmanager
    def in_a_terminal(self, *args: str):
        """`orch ARGS` in a real terminal (a window of an outer tmux on a socket of its own, 160x40, with this
        orch's environment); yields (screen, keys): what the terminal shows now, and keys typed into it."""
        from orchestrator.wait import retry_until

        outer = f"outer-{uuid.uuid4().hex[:6]}"

        def screen() -> str:
            return subprocess.run(
                ["tmux", "-L", outer, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True
            ).stdout

        def keys(*typed: str) -> None:
            subprocess.run(["tmux", "-L", outer, "send-keys", "-t", "t", *typed], check=True)

        def gone_or_detached() -> bool:
            return subprocess.run(["tmux", "-L", outer, "has-session", "-t", "t"]).returncode != 0 or (
                "detached" in screen()
            )

        try:
            cmd = " ".join(shlex.quote(a) for a in self.argv(*args))
            subprocess.run(
                ["tmux", "-L", outer, "new-session", "-d", "-s", "t", "-x", "160", "-y", "40", cmd],
                env=self.env,
                check=True,
            )
            yield screen, keys
            keys("C-b", "d")
            retry_until(gone_or_detached, 10, 0.2, "the attach client to detach")
        finally:
            subprocess.run(["tmux", "-L", outer, "kill-server"], capture_output=True)

    def sweep(self, text: str, name: str = "sweep.yaml") -> Path:
        path = self.tmp / name
        path.write_text(textwrap.dedent(text))
        return path

    def store(self, *parts: str) -> Path:
        return self.tmp.joinpath("store", *parts)

    def close(self) -> None:
        self.tmux("kill-server")
        lock_dir = self.home / "locks"
        for lock in lock_dir.glob("*.lock") if lock_dir.exists() else []:
            pid = lock.read_text().strip()
            if pid.isdigit():
                subprocess.run(["kill", "-9", pid], capture_output=True)


@pytest.fixture
def orch(tmp_path):
    o = Orch(tmp_path)
    yield o
    o.close()


@pytest.fixture
def script(tmp_path):
    """Write a small python program for sweeps to run; returns its path."""

    def write(body: str, name: str = "job.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(body))
        return path

    return write


JOB = """
import json, os, signal, sys, time
run, out = os.environ["ORCH_RUN_ID"], os.environ["ORCH_RUN_DIR"]
marks, steps, release = sys.argv[1], int(sys.argv[2]), sys.argv[3]
code = int(sys.argv[4]) if len(sys.argv) > 4 else 0
lock = os.path.join(marks, run + ".running")
try:
    os.mkdir(lock)
except FileExistsError:  # another copy of this run is running right now
    open(os.path.join(marks, "DUPLICATE"), "a").write(run + "\\n")
def bye(*_):
    os.rmdir(lock)
    sys.exit(143)
signal.signal(signal.SIGTERM, bye)
signal.signal(signal.SIGHUP, bye)  # a killed tmux session hangs up on it: it ends, and so does its lock
with open(os.path.join(marks, "starts.log"), "a") as f:
    f.write(f"{run} {os.environ['ORCH_ATTEMPT']} {os.environ['ORCH_PARAMS_JSON']}\\n")
i = 0
while i < steps or (release and not os.path.exists(release)):
    print(f"tick {i} of {run}", flush=True)
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": i, "loss": 1.0 / (i + 1), "acc": i / (i + 1)}) + "\\n")
    i += 1
    time.sleep(0.1)
print(f"finished {run} with code {code}", flush=True)
os.rmdir(lock)
sys.exit(code)
"""


@pytest.fixture
def job(tmp_path):
    """A sweep command template for a job that ticks, writes metrics, guards against running twice at once.

    job(steps, release=False, code=0) -> command string; markers land in tmp_path/marks
    (starts.log: one line per start; DUPLICATE: written if a run ever ran twice at once).
    Runs with release=True keep going until `tmp_path/release` exists.
    """
    path = tmp_path / "job.py"
    path.write_text(JOB)
    marks = tmp_path / "marks"
    marks.mkdir()

    def command(steps: int = 5, release: bool = False, code: int = 0) -> str:
        rel = str(tmp_path / "release") if release else "''"
        return f"{{python}} {path} {marks} {steps} {rel} {code}"

    command.marks = marks
    command.release = tmp_path / "release"
    return command


def run_states(orch: Orch, sweep: str, every: bool = False, gap: float = STATUS_GAP_S) -> dict:
    """`orch status SWEEP --json` as {run_id: run}; {} until the controller has registered the sweep. `every`: with
    --all, every run's own record (without it, a run the summary does not count active is as the last pass wrote
    it: a controller killed mid-pass may have claimed it since). `gap`: at least this long since the test's last call
    (ENDED_GAP_S where the state waited for, once reached, stays)."""
    import json

    # each call is a Python process that imports boto3 and makes clients (about 1 s of CPU): a wait that polls
    # through it every 0.2 s kept a core busy on a 2-core machine. Calls are spaced `gap` apart.
    time.sleep(max(0.0, orch.last_status + gap - time.monotonic()))
    r = orch("status", sweep, "--json", *(["--all"] if every else []))
    orch.last_status = time.monotonic()
    if "no sweep named" in r.err:
        return {}
    assert r.code == 0, r.err
    return {run["run_id"]: run for run in json.loads(r.out)["runs"]}


def signal_all(pids, sig) -> None:
    """`sig` to each of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@contextlib.contextmanager
def held(pids):
    """The processes wait (SIGSTOP) for the body, whatever it raises, then go on (SIGCONT): what they are sent
    meanwhile waits for them, so a moment a test needs is an event, not a race with their speed."""
    signal_all(pids, signal.SIGSTOP)
    try:
        yield
    finally:
        signal_all(pids, signal.SIGCONT)


def command_processes(ctl: Path, attempt: int = 1) -> list[int]:
    """The processes of an attempt's command that catch SIGUSR1 (the trainer's ranks), found from the pid its agent
    wrote in the run's `ctl` folder; [] until it is written."""
    from orchestrator.host.attempt import pid_file, usr1_targets

    try:
        return usr1_targets(int((ctl / pid_file("cmd", attempt)).read_text()))
    except (FileNotFoundError, ValueError):
        return []


def starts(marks: Path) -> list:
    f = marks / "starts.log"
    return [line.split(" ", 2)[:2] for line in f.read_text().splitlines()] if f.exists() else []


@pytest.fixture
def identity(tmp_path) -> Path:
    """An ed25519 key pair for SSH to fake hosts (private key file; its .pub beside it)."""
    return make_identity(tmp_path, "orch-test")


def make_identity(folder: Path, comment: str) -> Path:
    """A new ed25519 key pair in `folder`: id_ed25519 (private) and id_ed25519.pub ending in `comment`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "id_ed25519"
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    path.chmod(0o600)
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    path.with_name("id_ed25519.pub").write_text(f"{pub} {comment}\n")
    return path


@contextlib.contextmanager
def fake_cloud(tmp_path: Path, orch, **settings):
    """A fake cloud (moto + loopback hosts; `settings`: FakeCloud's), the orch fixture's CLI pointed at it; at its end
    nothing of any sweep is left and no call was refused by the documented policy."""
    from tests.fakecloud import FakeCloud

    with FakeCloud(tmp_path / "cloud", **settings) as c:
        orch.env.update(c.env())
        yield c
        # nothing of any sweep may outlive its test: instances, security groups, templates, profiles
        leaks = c.all_leftovers()
        assert not leaks, f"left behind: {leaks}"
        # a refusal orch only logged is still a call the documented policy does not allow
        assert not c.gate.denied, f"the policy `orch aws policy` prints refused: {c.gate.denied}"


@pytest.fixture
def cloud(tmp_path, orch):
    """A fake cloud (moto + loopback hosts); the orch fixture's CLI is pointed at it."""
    with fake_cloud(tmp_path, orch) as c:
        yield c


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    """A store of each kind: a LocalStore folder, and an S3Store on a fake cloud's moto."""
    from orchestrator.store.folder import LocalStore
    from orchestrator.store.s3 import S3Store

    if request.param == "local":
        yield LocalStore(str(tmp_path / "store"))
        return
    from tests.fakecloud import BUCKET, FakeCloud

    with FakeCloud(tmp_path / "cloud") as cloud:
        s = S3Store(f"s3://{BUCKET}/pre", client=cloud.client("s3"))
        s.check()
        yield s


def no_traceback(r):
    assert "Traceback" not in r.out + r.err, r.out + r.err


def finish(orch, path, timeout=120):
    r = orch("launch", str(path), timeout=timeout)
    no_traceback(r)
    return r
