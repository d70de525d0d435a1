"""Slurm's commands as orch uses them (sbatch, squeue, scancel, scontrol), through a shell here or on the login node.

Every answer is read from a format orch asks for (`squeue -O` with `|` after each field, `sbatch --parsable`), never
from a human table; a line that does not parse is left out with a warning, as any input from elsewhere. A command
that cannot reach slurmctld (it restarts, it is busy) is tried again with backoff for a while before it counts as
failed: a scheduler's hiccup is never a run's failure.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from dataclasses import dataclass

from orchestrator.errors import OrchError
from orchestrator.remote.runners import Result, Runner

log = logging.getLogger("orch.slurm")

OLDEST = (22, 5)  # the oldest Slurm orch reads (squeue -O's RestartCnt, --me)
FIELDS = ("JobID", "Name", "State", "Reason", "NodeList", "RestartCnt", "StartTime")
# `--all`: jobs in hidden partitions too. `FIELD:|`: width 0 (squeue then prints the whole value, unpadded: its
# source, src/squeue/opts.c, not its manual) and `|` after it; without a width a field is cut at 20 characters.
SQUEUE = "squeue --me --all --noheader --states=all -O " + shlex.quote(",".join(f"{f}:|" for f in FIELDS))
# what a command prints when slurmctld does not answer now: worth another try
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|Zero Bytes were transmitted|"
    r"Transport endpoint|cannot reach the login node|Communication connection failure|"
    r"Slurm backup controller in standby|Resource temporarily",
    re.IGNORECASE,
)
RETRY_S = 60.0


@dataclass(frozen=True)
class Job:
    """One job as squeue shows it."""

    id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, ... (squeue's long names)
    reason: str  # why it pends (Priority, Resources, ...) or "None"
    nodes: str  # its node list ("" while pending)
    restarts: int  # times Slurm requeued it
    start: str  # when it started (or is expected to), as Slurm writes it

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED")

    def forgotten(self) -> Job:
        """The job as orch last saw it, gone from squeue altogether (Slurm forgets an ended job after MinJobAge)."""
        return Job(self.id, self.name, "GONE", self.reason, self.nodes, self.restarts, self.start)

    @property
    def live(self) -> bool:
        return self.pending or self.state in ("RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT")


def parse_jobs(out: str) -> list[Job]:
    jobs = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) > 1 and not parts[0].strip().isdigit():  # an array's or a heterogeneous job's (123_4, 123+0)
            continue  # orch submits neither: not one of its jobs
        if len(parts) < len(FIELDS) or not parts[5].strip().isdigit():
            log.warning("squeue printed a line orch cannot read; left out: %r", line[:200])
            continue
        jid, name, state, reason, nodes, restarts, start = (p.strip() for p in parts[: len(FIELDS)])
        jobs.append(Job(jid, name, state.split()[0] if state else "", reason, nodes, int(restarts), start))
    return jobs


def parse_version(out: str) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", out)
    return (int(m[1]), int(m[2])) if m else None


class Slurm:
    def __init__(self, shell: Runner, retry_s: float = RETRY_S):
        self.shell, self.retry_s = shell, retry_s

    def _run(self, command: str, stdin: bytes | None = None, timeout: float = 60.0, retry: bool = True) -> Result:
        """The command's result; tried again (1 s, 2 s, 4 s... for `retry_s`) while slurmctld does not answer."""
        end, wait = time.monotonic() + (self.retry_s if retry else 0.0), 1.0
        while True:
            r = self.shell.run(command, timeout=timeout, stdin=stdin)
            if r.code == 0 or not UNREACHABLE.search(r.err + r.out) or time.monotonic() + wait > end:
                return r
            log.info("Slurm did not answer (%s); asking again in %.0f s", (r.err or r.out).strip()[:120], wait)
            time.sleep(wait)
            wait = min(wait * 2, 15.0)

    def check(self, command: str, stdin: bytes | None = None, retry: bool = True) -> str:
        r = self._run(command, stdin, retry=retry)
        if r.code != 0:
            said = " ".join(line.removeprefix("sbatch: error: ") for line in (r.err or r.out).strip().splitlines())
            word = next((w for w in command.split() if w in ("sbatch", "squeue", "scancel", "scontrol")), "Slurm")
            raise OrchError(f"`{word}` refused: {said[-600:] or f'exit code {r.code}'}")
        return r.out

    def version(self) -> tuple[int, int]:
        r = self.shell.run("sbatch --version", timeout=30)
        if r.code == 127 or "not found" in r.err:
            raise OrchError(
                "Slurm's commands (sbatch, squeue) are not on the PATH there: install Slurm's client, or "
                "name the cluster's login node in `slurm.login`"
            )
        found = parse_version(r.out)
        if found is None:
            raise OrchError(f"`sbatch --version` printed {r.out.strip()[:80]!r}, which orch cannot read")
        if found < OLDEST:
            raise OrchError(
                f"this is Slurm {found[0]}.{found[1]:02d}; orch needs Slurm {OLDEST[0]}.{OLDEST[1]:02d} or newer "
                "(it reads squeue's RestartCnt and --me). Ask your cluster's admins which login node has a newer one."
            )
        return found

    def submit(self, options: list[str], script: str) -> str:
        """The job id of a new job running `script` (sbatch reads it from its standard input)."""
        # the job gets this shell's environment (sbatch --export=ALL): not a restart count of a job orch runs in
        command = "env -u SLURM_RESTART_COUNT sbatch --parsable " + " ".join(shlex.quote(o) for o in options)
        out = self.check(command, script.encode())
        jid = out.strip().split(";")[0]
        if not jid.isdigit():
            raise OrchError(f"sbatch answered {out.strip()[:80]!r}, not a job id")
        return jid

    def test_only(self, options: list[str]) -> str:
        """Slurm's own verdict on the options, without submitting (`sbatch --test-only`); "" when it takes them."""
        r = self._run("sbatch --test-only " + " ".join(shlex.quote(o) for o in options) + " --wrap true")
        if r.code == 0:
            return ""
        return " ".join(line.removeprefix("sbatch: error: ") for line in r.err.strip().splitlines()) or r.out

    def jobs(self) -> list[Job] | None:
        """The user's jobs (those that ended a short while ago included); None when Slurm does not answer now."""
        r = self._run(SQUEUE, retry=False, timeout=30)
        if r.code != 0:
            log.info("squeue: %s", (r.err or r.out).strip()[:200])
            return None
        return parse_jobs(r.out)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            self.check("scancel " + " ".join(shlex.quote(j) for j in job_ids))

    def signal_batch(self, job_id: str, signal: str) -> bool:
        """Signal a job's batch shell alone (its script's trap passes it on); False when the job is gone."""
        return self._run(f"scancel --batch --signal={signal} {shlex.quote(job_id)}").code == 0
