"""What orch put on ssh hosts and is still there, over the hosts of the ssh sweeps launched here (the registry's
`leftovers`): `orch gc` lists it by host, `orch down SWEEP` (or `--all`) removes a sweep's, and `orch down
orch-code` the code caches that every sweep shares (orch's agent, `workdir:` snapshots) where no run of orch runs."""

from __future__ import annotations

import contextlib
import shlex

from orchestrator.backends.ssh import sessions
from orchestrator.backends.ssh.link import HostDown, Link
from orchestrator.backends.ssh.settings import SshSection, host_specs
from orchestrator.errors import OrchError
from orchestrator.sweep.spec import Sweep

CODE = "orch-code"  # the name `orch gc` gives the code caches (no sweep's: shared by all)
NAMES = CODE
_links: dict[str, Link] = {}  # host label -> its link, from the last scan (remove() is given the label only)

SCAN = (
    'cd "$HOME/orch" 2>/dev/null || exit 0; '
    'for d in runs/*/; do [ -d "$d" ] && echo "RUN ${d#runs/}"; done; '
    'for d in code/*/ runs/.code/*/; do [ -d "$d" ] && echo "CODE ~/orch/$d"; done; '
    f"{sessions.LIST}"
)


def _hosts(sweeps: list[Sweep]) -> dict[str, Link]:
    links = {}
    for sweep in sweeps:
        section = sweep.spec.section_as("ssh", SshSection)
        for spec in host_specs(section):
            links.setdefault(spec.label, Link(spec, section.key, section.known_hosts))
    return links


def scan(sweeps: list[Sweep], problems: list[str] | None = None) -> dict[str, dict[str, list[str]]]:
    """{host: {sweep or `orch-code`: [what, ...]}}; a host that does not answer raises, or with `problems` given is
    named there and left out."""
    _links.clear()
    _links.update(_hosts(sweeps))
    out: dict[str, dict[str, list[str]]] = {}
    for label, link in _links.items():
        try:
            text = link.check(SCAN, timeout=30)
        except (HostDown, OrchError) as exc:
            if problems is None:
                raise OrchError(f"{label}: not searched for what orch left there: {exc}") from None
            problems.append(f"{label}: not searched for what orch left there: {exc}")
            continue
        finally:
            link.close()
        found: dict[str, list[str]] = {}
        for line in text.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "RUN":
                found.setdefault(rest.rstrip("/"), []).append(f"~/orch/runs/{rest}")
            elif kind == "CODE":
                found.setdefault(CODE, []).append(rest)
            elif line.startswith("orch_"):
                name = line.split()[0]
                sweep = next((s.spec.name for s in sweeps if name.startswith(f"orch_{s.spec.name}_")), None)
                if sweep is not None:
                    found.setdefault(sweep, []).append(f"tmux session {name}")
        if found:
            out[label] = found
    return out


def remove(place: str, name: str) -> list[str]:
    """Remove what `name` holds on host `place`: a sweep's sessions (with every process in them), run folders and
    tunnel file; or, for `orch-code`, the code caches, only while no session of orch runs there."""
    link = _links.get(place)
    if link is None:
        return []
    try:
        if name == CODE:
            busy = link.check(sessions.LIST, timeout=30).strip()
            if busy:
                raise OrchError(f"{place}: runs of orch still run there ({busy.split()[0]}...); their code stays")
            link.check('rm -rf "$HOME/orch/code" "$HOME/orch/runs/.code"', timeout=60)
            return [f"{place}: ~/orch/code, ~/orch/runs/.code"]
        q = shlex.quote(name)
        script = sessions.kill_script(f"orch_{name}_", every=True)
        link.check(f'{script}; rm -rf "$HOME/orch/runs/"{q} "$HOME/orch/tunnels/"{q}.json', timeout=60)
        return [f"{place}: ~/orch/runs/{name}"]
    finally:
        with contextlib.suppress(Exception):
            link.close()
