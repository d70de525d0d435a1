"""The slurm backend: each attempt of a run is one job of the user's Slurm cluster, its agent in a tmux server of the
job's own (script.py), writing to a store the nodes reach (a shared folder, or S3).

orch submits, lists and cancels through Slurm's own commands (commands.py), here or on the login node (shell.py),
and never more than `max_parallel` jobs of a sweep queued or running at once. A job Slurm ends (its time limit, a
requeue, a preemption, a node going down, someone's scancel) ends its attempt interrupted; the run goes on in a new
job from its newest checkpoint, as after a spot reclaim.
"""

from __future__ import annotations

import builtins
import logging
import os
import shlex
import time
from dataclasses import replace
from queue import SimpleQueue

from orchestrator import contract
from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.base import ACQUIRING, BackendBase, Host, Outcome
from orchestrator.backends.slurm import checks, script
from orchestrator.backends.slurm.commands import Job, Slurm
from orchestrator.backends.slurm.ledger import Ledger
from orchestrator.backends.slurm.settings import SlurmSection, gpus_of
from orchestrator.backends.slurm.shell import login_target, shell_for
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.store.lifecycle import RunStatus, StopReason
from orchestrator.store.status import FAILED, QUEUED
from orchestrator.sweep.spec import Sweep
from orchestrator.sweep.tasks import new_task, on_host

log = logging.getLogger("orch.slurm")

STOP_WAIT_S = 30.0  # a stopped job's agent syncs its last checkpoint; then the job is cancelled whatever it does
# sbatch refusals that pass with time (the user's job submit limit, a busy controller): the run waits; any other
# fails the attempt (counted: a permanent refusal, such as a QOS with DenyOnLimit, ends the run after max_restarts)
LIMITS = ("job submit limit", "temporarily", "busy", "Unable to contact", "Socket timed out")


class SlurmBackend(BackendBase):
    name = "slurm"
    poll_s = 2.0
    stale_s = 60.0  # agents heartbeat every 2 s into the store; a job silent this long has lost its node
    start_timeout_s = 180.0  # from when orch first sees the job running (a job may pend for hours before)
    releases_interrupted_host = False  # the agent ends its job

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.settings: SlurmSection = sweep.spec.section_as("slurm", SlurmSection)
        self.shell = shell_for(self.settings)
        self.slurm = Slurm(self.shell)
        self.gpus = gpus_of(sweep.spec)
        self.nodes = sweep.spec.resources.nodes if sweep.spec.resources else 1
        self.home: str | None = None
        self.jobs: dict[str, tuple[str, int, Job]] = {}  # job id -> (run, attempt, job): the live ones, as listed
        self.running_since: dict[str, float] = {}
        self.outcomes: SimpleQueue[Outcome] = SimpleQueue()
        self.bundle: code_bundle.Bundle | None = None
        self.cancelled: set[str] = set()  # jobs this controller cancelled (asked once)
        self.listed = False  # squeue answered this process at least once
        self.ended: dict[str, tuple[str, int, Job]] = {}  # ended or requeued since the last pass, for learn()
        self.ledger = Ledger(None, sweep.spec.name, self.settings.price_per_gpu_hour, self.gpus)

    # --- where things are ------------------------------------------------------------------------------------------

    @property
    def base(self) -> str:
        """`slurm.workdir` as an absolute path (sbatch takes no `~`): the login shell's home, asked once."""
        if self.home is None:
            self.home = self.shell.check('printf %s "$HOME"', timeout=30).strip() or "/"
        w = self.settings.workdir
        return self.home.rstrip("/") + w[1:] if w == "~" or w.startswith("~/") else w

    def session(self, run_id: str) -> str:
        return contract.session_name(self.sweep.spec.name, run_id)

    def ctl(self, run_id: str) -> str:
        return contract.ctl_dir(self.base, self.sweep.spec.name, run_id)

    def _store(self):
        if self.ledger.store is None:
            from orchestrator.store import open_store

            self.ledger.store = open_store(self.sweep.store_url)
        return self.ledger

    # --- listing --------------------------------------------------------------------------------------------------

    def list(self) -> builtins.list[Host]:
        """One squeue. Slurm not answering keeps the last listing (a slurmctld restart loses no run). A job that
        ended or that Slurm requeued since the last pass stays listed until learn() has judged it (_judge)."""
        listed = self.slurm.jobs()
        if listed is not None:
            self._take(listed)
            self.listed = True
        now, out = time.time(), []
        for jid, (run_id, attempt, job) in self.jobs.items():
            waiting = job.pending or not job.live  # not started yet, or ended and not judged yet (learn)
            since = self.running_since.setdefault(jid, now) if not waiting else None
            deadline = since + self.start_timeout_s if since is not None else None
            for node in range(1 if waiting else self.nodes):  # a job holds all its nodes, or none yet
                out.append(Host(run_id, jid, job.nodes, attempt, waiting, deadline, node=node, nodes=self.nodes))
        return out

    def _take(self, listed: builtins.list[Job]) -> None:
        by_session = {self.session(r.run_id): r.run_id for r in self.sweep.runs}
        ledger, jobs, seen = self._store(), {}, set()
        for job in listed:
            parsed = script.parse_name(job.name)
            if parsed is None or parsed[0] not in by_session:
                continue
            run_id, attempt = by_session[parsed[0]], parsed[1]
            ledger.seen(job, run_id, attempt)
            seen.add(job.id)
            if job.live and job.id not in self.cancelled:
                jobs[job.id] = (run_id, attempt, job)  # a requeued one too, until learn() has read its run's record
            if job.restarts and job.live or not job.live and job.id in self.jobs:
                self.ended[job.id] = (run_id, attempt, job)  # judged by learn(), with its run's record: listed till
                jobs[job.id] = (run_id, attempt, job)  # then, so that no new attempt starts before the verdict
        for jid, (run_id, attempt, job) in self.jobs.items():  # gone from squeue altogether since the last pass
            if jid not in seen and jid not in self.cancelled:
                self.ended[jid] = jobs[jid] = (run_id, attempt, job.forgotten())
        ledger.gone(seen)
        self.jobs = jobs

    def _judge(self, statuses: dict[str, RunStatus]) -> None:
        """The jobs that ended, or that Slurm requeued, since the last pass. One whose attempt's agent never reported
        (its node could not launch it, no Python or tmux there...) is the attempt's failure, counted against
        max_restarts, with what the job printed: else orch would submit it again every pass. A requeued job is
        cancelled: the run goes on in a new job (Slurm would hold a requeued one back about 2 minutes)."""
        for jid, (run_id, attempt, job) in self.ended.items():
            record = statuses.get(run_id)
            if record is not None and record.attempt == attempt and record.state.active and not record.heartbeat:
                self.outcomes.put(Outcome(run_id, attempt, FAILED, self._unstarted(jid, job, run_id)))
        requeued = [jid for jid, (_r, _a, job) in self.ended.items() if job.live and jid not in self.cancelled]
        for jid in self.ended:
            self.jobs.pop(jid, None)
        self.ended = {}
        if requeued:
            log.info("Slurm requeued job(s) %s: cancelled; their runs go on in new jobs", ", ".join(requeued))
            self._cancel(requeued)

    def _unstarted(self, jid: str, job: Job, run_id: str) -> str:
        how = "was requeued by Slurm" if job.live else f"ended ({job.state.lower()})"
        out = self.shell.run(f"tail -c 400 {shlex.quote(f'{self.ctl(run_id)}/slurm-{jid}.out')}", timeout=30).out
        said = " ".join(out.split())[-300:]
        return f"job {jid} {how} before orch's agent started in it, on {job.nodes or 'its node'}" + (
            f"; it printed: {said}" if said else f"; see `scontrol show job {jid}` and the node's slurmd log"
        )

    def _cancel(self, job_ids: builtins.list[str]) -> None:
        for jid in job_ids:
            self._store().by_orch(jid)
            self.cancelled.add(jid)
        try:
            self.slurm.cancel(job_ids)
        except OrchError as exc:
            log.warning("could not cancel job(s) %s now: %s", ", ".join(job_ids), exc)

    def _of_run(self, run_id: str) -> builtins.list[tuple[str, int, Job]]:
        """The run's jobs, newest attempt first, as this process last listed them (listed now if it never has: `orch
        down`, `attach`); the controller lists once at the start of each pass."""
        if not self.listed:
            self.list()
        return sorted(((jid, a, j) for jid, (r, a, j) in self.jobs.items() if r == run_id), key=lambda x: -x[1])

    # --- starting -------------------------------------------------------------------------------------------------

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        return new_task(
            self.sweep,
            run_id,
            attempt,
            command,
            params_json,
            self.base,
            env={"ORCH_PYTHON": self.settings.python},
            heartbeat_s=2.0,
            sync_s=5.0,
            notice_poll_s=2.0,
            host="",
            replaces=replaces,
            host_parts=[contract.SCHEDULED],
        )

    def start(self, task: RunTask) -> Host:
        mine = self._of_run(task.run_id)
        if any(a >= task.attempt for _j, a, _x in mine):
            raise OrchError(f"run {task.run_id} already has a job for attempt {task.attempt}; not submitting twice.")
        if mine:  # an earlier attempt's job still there: it serves no attempt now
            self._cancel([jid for jid, _a, _x in mine])
        if len(self.jobs) >= self.sweep.spec.max_parallel:
            return self._queued(task, f"{len(self.jobs)} job(s) of the sweep still in Slurm's queue (max_parallel)")
        try:
            jid = self._submit(task)
        except OrchError as exc:
            if any(word.lower() in str(exc).lower() for word in LIMITS):
                return self._queued(task, str(exc))
            self.outcomes.put(Outcome(task.run_id, task.attempt, FAILED, str(exc)))
            return Host(task.run_id, ACQUIRING, "", attempt=task.attempt, provisioning=True)
        self._store().submitted(jid, task.run_id, task.attempt)
        self.jobs[jid] = (task.run_id, task.attempt, Job(jid, "", "PENDING", "submitted", "", 0, ""))
        log.info("%s: attempt %s is job %s", task.run_id, task.attempt, jid)
        return Host(task.run_id, jid, "", attempt=task.attempt, provisioning=True)

    def _queued(self, task: RunTask, why: str) -> Host:
        self.outcomes.put(Outcome(task.run_id, task.attempt, QUEUED, why))
        return Host(task.run_id, ACQUIRING, "", attempt=task.attempt, provisioning=True)

    def _submit(self, task: RunTask) -> str:
        """Each node's task and the job's node.sh in the run's folders, then the job (script.py)."""
        b = self._install()
        agents = []
        for rank in range(self.nodes):
            run_dir, ctl_dir = script.node_dirs(task, rank)
            shape = {"ORCH_MASTER_ADDR": "", "ORCH_MASTER_PORT": ""} if self.nodes > 1 else {}  # the job's, at start
            mine = replace(on_host(task, "", rank, self.nodes, shape), run_dir=run_dir, ctl_dir=ctl_dir)
            path = contract.task_file(ctl_dir, task.attempt)
            self.shell.put_bytes(mine.to_json(), path)
            agents.append(contract.agent_command(self.settings.python, path, ctl_dir, pythonpath=b.remote_dir))
        node_sh = f"{task.ctl_dir}/node-{task.attempt}.sh"
        self.shell.put_bytes(script.node_script(task, agents, self.settings.python).encode(), node_sh, 0o700)
        name = script.job_name(task.session, task.attempt)
        opts = script.options(self.settings, name, self.gpus, f"{task.ctl_dir}/slurm-%j.out", self.nodes)
        return self.slurm.submit([*opts, f"--chdir={self.base}"], script.batch_script(task, node_sh, self.nodes))

    def _install(self) -> code_bundle.Bundle:
        """orch's host code in ~/orch/code/DIGEST, once per controller (the nodes share the login node's home)."""
        if self.bundle is None:
            b = code_bundle.build()
            self.shell.check(code_bundle.install_command(b), timeout=120, stdin=b.data)
            self.bundle = b
        return self.bundle

    def drain_outcomes(self) -> builtins.list[Outcome]:
        out = []
        while not self.outcomes.empty():
            out.append(self.outcomes.get())
        return out

    # --- stopping -------------------------------------------------------------------------------------------------

    def release(self, host: Host) -> None:
        if host.host_id != ACQUIRING and host.host_id.isdigit():
            self.jobs.pop(host.host_id, None)
            self._cancel([host.host_id])

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """A pending job is cancelled; a running one's agent is told why and asked to stop (its batch shell passes
        USR2 on as SIGTERM), given STOP_WAIT_S to sync what it wrote, then cancelled whatever it does."""
        mine = self._of_run(run_id)
        for jid, _attempt, job in mine:
            if not job.pending:
                for rank in range(self.nodes):  # every node's agent reads why (node 0 records it)
                    ctl = script.node_ctl(self.ctl(run_id), rank)
                    self.shell.put_bytes(f"{reason}\n".encode(), f"{ctl}/{contract.STOP_REASON_FILE}", 0o644)
                if self.slurm.signal_batch(jid, "USR2"):
                    self._wait_gone(jid)
            self.jobs.pop(jid, None)
            self._cancel([jid])
        return bool(mine)

    def _wait_gone(self, jid: str) -> None:
        end = time.time() + STOP_WAIT_S
        while time.time() < end:
            listed = self.slurm.jobs()
            if listed is not None and not any(j.id == jid and j.live for j in listed):
                return
            time.sleep(1.0)

    def notify_interruption(self, run_id: str) -> bool:
        running = [jid for jid, _a, job in self._of_run(run_id) if not job.pending]
        if not running:
            return False
        self.shell.put_bytes(b"chaos\n", contract.notice_path(self.ctl(run_id)), 0o644)
        return True

    def attach(self, run_id: str, node: int = 0) -> int:
        running = [jid for jid, _a, job in self._of_run(run_id) if not job.pending]
        if not running:
            raise OrchError(f"run {run_id} has no running job now. See its log with `orch logs {run_id}`.")
        if node >= self.nodes:
            raise OrchError(f"run {run_id} runs on {self.nodes} node(s): --node takes 0 to {self.nodes - 1}.")
        jid = running[0]
        argv = ["srun", f"--jobid={jid}", "--overlap", f"--relative={node}", "--nodes=1", "--ntasks=1", "--pty"]
        argv += ["tmux", "-L", f"orch-job{jid}.{node}", "attach-session"]
        argv += ["-t", f"={self.session(run_id)}:run"]
        target = login_target(self.settings)
        if target is not None:
            argv = [
                "ssh", "-t", "-p", str(target.port),
                "-o", f"UserKnownHostsFile={os.path.expanduser(self.settings.known_hosts)}",
                "-o", "StrictHostKeyChecking=yes",
                *(["-i", os.path.expanduser(target.identity)] if target.identity else []),
                f"{target.user}@{target.address}", shlex.join(argv),
            ]  # fmt: skip
        os.execvp(argv[0], argv)
        return 0

    # --- the sweep's lifetime -------------------------------------------------------------------------------------

    def spend(self) -> float:
        return self._store().spend()

    def flush(self) -> None:
        self._store().flush()

    def learn(self, statuses: dict[str, RunStatus]) -> None:
        self._judge(statuses)
        self.flush()

    def _cluster(self) -> checks.Cluster:
        return checks.Cluster(self.sweep, self.settings, self.slurm, self.shell, self.gpus, self.base)

    def preflight(self) -> None:
        checks.preflight(self._cluster())

    def plan(self) -> dict | None:
        return checks.plan(self._cluster())

    def teardown(self) -> builtins.list[str]:
        """Every job of the sweep cancelled (none stays in squeue), and the runs' folders under `slurm.workdir`
        removed (what they wrote is in the store)."""
        self.list()
        gone = [f"job {jid}" for jid in self.jobs]
        self._cancel(list(self.jobs))
        self.jobs = {}
        folder = f"{self.base}/{self.sweep.spec.name}"
        try:
            self.shell.check(f"rm -rf {shlex.quote(folder)}", timeout=60)
            gone.append(folder)
        except OrchError as exc:
            log.warning("could not remove %s: %s", folder, exc)
        self.flush()
        return gone
