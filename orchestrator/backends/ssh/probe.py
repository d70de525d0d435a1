"""What an ssh host has (Python, tmux, flock, free disk, GPUs), asked in one command; what it lacks, with the fix."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from orchestrator.backends.ssh.link import Link
from orchestrator.backends.ssh.settings import HostSpec
from orchestrator.errors import OrchError

MIN_FREE_MB = 1024  # a host with less free space in its home is refused: checkpoints would fail half-way

PY_CHECK = "import sys; print('PY', '%d.%d' % sys.version_info[:2], int(sys.version_info >= (3, 10)))"


@dataclass(frozen=True)
class Facts:
    python: str
    gpus: int  # usable by orch: the host's `gpus:` or what nvidia-smi lists
    free_mb: int


def script(python: str) -> str:
    return (
        f"{shlex.quote(python)} -c {shlex.quote(PY_CHECK)} 2>/dev/null || echo 'PY none 0'; "
        "for t in tmux flock tar; do command -v $t >/dev/null 2>&1 || echo MISSING $t; done; "
        "echo DF $(df -Pk \"$HOME\" | awk 'NR==2 {print int($4/1024)}'); "
        "echo GPUS $(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    )


def probe(link: Link, gpus_per_run: int) -> Facts:
    """The host's facts; an OrchError naming the host, what it lacks and the fix, when it cannot serve this sweep."""
    spec = link.spec
    out = link.check(script(spec.python), timeout=60)
    words = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()}
    problems = []
    py = words.get("PY", ["none", "0"])
    if py[0] == "none":
        problems.append(f"no {spec.python} there: install Python 3.10+ or give its path (`python:` of the host)")
    elif py[1:] != ["1"]:
        problems.append(f"{spec.python} is Python {py[0]}; orch's agent needs 3.10+ (set `python:` of the host)")
    missing = [line.split()[1] for line in out.splitlines() if line.startswith("MISSING ")]
    if missing:
        problems.append(
            f"no {', '.join(missing)} there: install it (Debian/Ubuntu: apt-get install {' '.join(missing)})"
        )
    free = int(words.get("DF", ["0"])[0] or 0) if words.get("DF", ["0"])[0].isdigit() else 0
    if free < MIN_FREE_MB:
        problems.append(f"only {free} MB free in the login user's home; orch needs {MIN_FREE_MB} MB: free some space")
    found = words.get("GPUS", ["0"])
    gpus = spec.gpus if spec.gpus is not None else (int(found[0]) if found and found[0].isdigit() else 0)
    facts = Facts(spec.python, gpus, free)
    if gpus_per_run and slots(spec, facts, gpus_per_run) == 0:
        problems.append(f"it has {gpus} GPU(s) orch may use, and a run needs {gpus_per_run} (`resources.gpus`)")
    if problems:
        raise OrchError(f"{spec.label}: " + "; ".join(problems))
    return facts


def slots(spec: HostSpec, facts: Facts, gpus_per_run: int) -> int:
    """Runs at once on the host: its GPUs / the run's, or `runs:` (default 1) for runs that ask for no GPU."""
    if gpus_per_run:
        return facts.gpus // gpus_per_run
    return spec.runs or 1
