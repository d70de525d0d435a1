"""A real Slurm cluster on loopback for the tests: munged, slurmctld and two slurmd (nodes n1, n2 on this machine,
Debian's slurm-wlm 22.05 allows several slurmd on one host), each on free ports, in a folder of its own, with no
systemd; stopped by pid. Clients find it through SLURM_CONF (`env`).

Faults come through Slurm itself: `scontrol requeue`, a node set DOWN, slurmctld stopped and started again, and a
job in the partition `high` (PriorityTier=2) preempting those of the others (PreemptMode=REQUEUE).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from orchestrator.wait import retry_until

NODES = ("n1", "n2")


def available() -> bool:
    return all(shutil.which(t) for t in ("munged", "slurmctld", "slurmd", "sbatch"))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, root: Path, cpus: int = 2, time_limit: str = "INFINITE", broken: bool = False):
        self.root = root  # its configuration and logs (kept with the test's folder)
        # broken: its nodes cannot start a job (their spool folder's path is too long for slurmstepd's socket), so
        # Slurm requeues every job it sends them: a real fault of a misconfigured cluster
        self.broken = broken
        # its sockets (slurmstepd's, munged's) under a short path: a Unix socket's path has at most 108 bytes
        self.run_dir = Path(tempfile.mkdtemp(prefix="osl-"))
        self.cpus, self.time_limit = cpus, time_limit
        self.conf = root / "slurm.conf"
        self.munge_socket = self.run_dir / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs: list[subprocess.Popen] = []

    # --- lifetime ----------------------------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        for d in ("munge", "state", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o711)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._write_conf()
        self._munged()
        self.start_controller()
        for node in NODES:
            self._daemon(["slurmd", "-D", "-N", node], f"slurmd-{node}")
        retry_until(lambda: self.node_states() == {n: "idle" for n in NODES}, 60, 0.2, "both nodes idle")
        return self

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.kill_jobs_processes()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _write_conf(self) -> None:
        ctld, slurmd, *node_ports = _free_ports(2 + len(NODES))
        host = socket.gethostname()
        r = self.root
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={self.cpus} RealMemory=1000"
            for n, p in zip(NODES, node_ports)
        )
        self.conf.write_text(
            f"""ClusterName=orchtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={self.run_dir}/{"x" * 100 if self.broken else ""}%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=1
MpiDefault=none
SlurmUser=root
SlurmdUser=root
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
FirstJobId={random.randrange(10_000, 900_000)}
KillWait=5
MinJobAge=600
SchedulerParameters=sched_interval=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime={self.time_limit} State=UP
PartitionName=short Nodes={",".join(NODES)} MaxTime=1 State=UP
PartitionName=high Nodes={",".join(NODES)} MaxTime=INFINITE PriorityTier=2 State=UP
"""
        )

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.out", "ab")
        p = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, start_new_session=True)
        self.procs.append(p)
        return p

    def _munged(self) -> None:
        m = self.root / "munge"
        self._daemon(
            [
                "munged", "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={m / 'munge.key'}",
                f"--pid-file={m / 'munged.pid'}", f"--seed-file={m / 'seed'}",
                f"--log-file={self.root / 'log/munged.log'}",
            ],
            "munged",
        )  # fmt: skip
        retry_until(self.munge_socket.exists, 30, 0.05, "munged's socket")

    def start_controller(self) -> None:
        self.ctld = self._daemon(["slurmctld", "-D", "-i"], "slurmctld")
        retry_until(lambda: self.run("scontrol", "ping").returncode == 0, 60, 0.2, "slurmctld answering")

    def stop_controller(self) -> None:
        self.ctld.send_signal(signal.SIGTERM)
        self.ctld.wait(30)

    def kill_jobs_processes(self) -> None:
        """What jobs left (with proctrack/linuxproc a tmux server of a job's can outlive it): every process whose
        environment names this cluster's SLURM_CONF, but for the daemons."""
        daemons = {p.pid for p in self.procs}
        mark = f"SLURM_CONF={self.conf}".encode()
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            try:
                if pid in daemons or pid == os.getpid():
                    continue
                if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass

    # --- asking it -------------------------------------------------------------------------------------------------

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        """A Slurm command as a user types it, in the cluster's folder: a job it submits writes its slurm-N.out there,
        never into the folder pytest was started from (the repository: three such files were once committed)."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60, cwd=self.root)

    def node_states(self) -> dict[str, str]:
        r = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        return dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)

    def jobs(self) -> list[dict[str, str]]:
        """Every job Slurm still knows: id, name, state, reason, nodes."""
        r = self.run("squeue", "-h", "--states=all", "-o", "%i|%j|%T|%r|%N")
        keys = ("id", "name", "state", "reason", "nodes")
        return [dict(zip(keys, line.split("|"))) for line in r.stdout.splitlines() if line.strip()]

    def queued(self) -> list[dict[str, str]]:
        """The jobs pending or running (what `squeue` shows by default)."""
        return [j for j in self.jobs() if j["state"] in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")]

    def wait_for(self, predicate, what: str, timeout: float = 120):
        return retry_until(predicate, timeout, 0.2, what)
