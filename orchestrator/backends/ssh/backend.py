"""The ssh backend: runs on machines the user already has, each run an agent in a tmux session there.

orch makes no host and only connects out (link.py; host keys checked against the user's known_hosts). A run takes a
slot of a host (its GPUs / `resources.gpus`, or `runs:`); the agents reach the store through a port their sshd
forwards back over the controller's connection (server.py, store/tunneled.py). A host silent for `stale_s` is lost:
its runs start elsewhere from their newest checkpoint in the store.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import shlex
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from queue import SimpleQueue

from orchestrator import contract
from orchestrator.backends import bundle as code_bundle
from orchestrator.backends.base import ACQUIRING, BackendBase, Host, Outcome
from orchestrator.backends.ssh import probe, sessions
from orchestrator.backends.ssh.ledger import Ledger
from orchestrator.backends.ssh.link import DOWN_S, HostDown, Link, tunnel_file
from orchestrator.backends.ssh.sessions import Placed
from orchestrator.backends.ssh.settings import SshSection, host_specs
from orchestrator.contract import RunTask
from orchestrator.errors import OrchError
from orchestrator.store.lifecycle import StopReason
from orchestrator.store.status import QUEUED
from orchestrator.sweep.spec import Sweep, orch_home
from orchestrator.sweep.tasks import new_task, on_host

log = logging.getLogger("orch.ssh")

BASE = contract.REMOTE_BASE  # ~/orch/runs on each host, as on an instance
SOCKET = contract.REMOTE_TMUX_SOCKET
STOP_WAIT_S = 20.0
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


class SshBackend(BackendBase):
    name = "ssh"
    poll_s = 2.0
    stale_s = 30.0  # agents heartbeat every 2 s through the tunnel; a host silent this long is lost
    start_timeout_s = 120.0
    releases_interrupted_host = False  # the agent ends its own session

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.settings: SshSection = sweep.spec.section_as("ssh", SshSection)
        self.links = {h.label: Link(h, self.settings.key, self.settings.known_hosts) for h in host_specs(self.settings)}
        self.facts: dict[str, probe.Facts] = {}  # what each host has, probed once per process
        self.refused: dict[str, str] = {}  # hosts this sweep cannot use, and why (with the fix)
        self.seen: dict[str, dict[str, Placed]] = {}  # host -> {run: where it runs there}, as last listed
        self.outcomes: SimpleQueue[Outcome] = SimpleQueue()
        self.server = None
        self.bundle: code_bundle.Bundle | None = None
        self.installed: set[str] = set()
        self.gpus_per_run: int = (sweep.spec.resources.gpus or 0) if sweep.spec.resources else 0
        self.nodes = sweep.spec.resources.nodes if sweep.spec.resources else 1
        self.ledger = Ledger(None, sweep.spec.name, self.settings.price_per_hour, self.gpus_per_run)

    # --- what runs where ------------------------------------------------------------------------------------------

    def session(self, run_id: str) -> str:
        return contract.session_name(self.sweep.spec.name, run_id)

    def list(self) -> builtins.list[Host]:
        """One command per host (`tmux ls`). A host that does not answer keeps what it last showed for `stale_s`, so
        a dropped packet loses nothing; silent longer, it is lost: its runs are no longer listed (a run spanning
        hosts then misses that node, and its attempt ends on every node, as on AWS)."""
        by_session = {self.session(r.run_id): r.run_id for r in self.sweep.runs}
        with ThreadPoolExecutor(min(16, len(self.links))) as pool:
            listed = dict(zip(self.links, pool.map(self._sessions, self.links.values())))
        out, now = [], time.time()
        for label, found in listed.items():
            link = self.links[label]
            if found is not None:
                link.silent_since = None
                self.seen[label] = {by_session[s]: v for s, v in found.items() if s in by_session}
                self._ledger().ended(label, set(self.seen[label]))
            elif link.silent_since is None:
                link.silent_since = now
            elif now - link.silent_since > self.stale_s and self.seen.pop(label, None):
                log.warning("%s: silent for %.0f s: lost, with the runs it held", label, now - link.silent_since)
            for run_id, p in self.seen.get(label, {}).items():
                out.append(
                    Host(run_id, label, link.spec.address, attempt=p.attempt or None, node=p.node, nodes=p.nodes)
                )
        return out

    def _sessions(self, link: Link) -> dict[str, Placed] | None:
        try:
            r = link.run(sessions.LIST, timeout=15)
        except (HostDown, OrchError) as exc:
            log.debug("%s: not listed: %s", link.spec.label, exc)
            return None
        return sessions.parse(r.out, contract.session_prefix(self.sweep.spec.name))

    # --- starting ---------------------------------------------------------------------------------------------------

    def new_task(self, run_id: str, attempt: int, command: str, params_json: str, replaces: str = "") -> RunTask:
        return new_task(
            self.sweep,
            run_id,
            attempt,
            command,
            params_json,
            BASE,
            heartbeat_s=2.0,
            sync_s=5.0,
            notice_poll_s=2.0,
            host="",
            replaces=replaces,
        )

    def start(self, task: RunTask) -> Host:
        if any(task.run_id in runs for runs in self.seen.values()):
            raise OrchError(f"run {task.run_id} already runs on a host; not starting it twice.")
        tried, free = [], self._free_slots(task.replaces)
        while len(free) >= self.nodes:  # a run of N nodes takes a slot on each of N hosts, all at once
            group = free[: self.nodes]
            failed = self._start_group(group, task)
            if failed is None:
                lead = group[0][0].spec
                return Host(task.run_id, lead.label, lead.address, attempt=task.attempt, nodes=self.nodes)
            tried.append(failed[1])
            free = [f for f in free if f[0] is not failed[0]]
        why = "; ".join(tried) or self._busy()
        self.outcomes.put(Outcome(task.run_id, task.attempt, QUEUED, f"no free slot on a host now ({why})"))
        return Host(task.run_id, ACQUIRING, "", attempt=task.attempt, provisioning=True)

    def _start_group(self, group: builtins.list[tuple[Link, int]], task: RunTask) -> tuple[Link, str] | None:
        """One agent per node, followers first (node 0 reports once all are there); None when all started, else
        (the host that failed, why), with the nodes already started ended again."""
        env: dict[str, str] = {}
        if len(group) > 1:  # node 0's address as the controller reaches it, and a free port there: the rendezvous
            lead = group[0][0]
            try:
                port = lead.check(f"{shlex.quote(self.facts[lead.spec.label].python)} -c {shlex.quote(FREE_PORT)}")
            except (HostDown, OrchError) as exc:
                return self._failed(lead, task, exc)
            env = {"ORCH_MASTER_ADDR": lead.spec.address, "ORCH_MASTER_PORT": port.strip()}
        started: builtins.list[Link] = []
        for rank in sorted(range(len(group)), reverse=True):
            link, slot = group[rank]
            try:
                self._start_on(link, slot, on_host(task, link.spec.label, rank, len(group), env))
            except (HostDown, OrchError) as exc:
                for other in started:
                    with contextlib.suppress(HostDown, OrchError):
                        other.run(sessions.kill_script(task.session))
                return self._failed(link, task, exc)
            started.append(link)
        for rank, (link, slot) in enumerate(group):
            self.seen.setdefault(link.spec.label, {})[task.run_id] = Placed(task.attempt, slot, rank, len(group))
            slots = probe.slots(link.spec, self.facts[link.spec.label], self.gpus_per_run)
            self._ledger().started(link.spec.label, task.run_id, task.attempt, slots)
        return None

    def _failed(self, link: Link, task: RunTask, exc: Exception) -> tuple[Link, str]:
        if not isinstance(exc, HostDown):  # not asked again for a while (DOWN_S); its other runs go on
            link.down(str(exc))
        log.warning("%s: could not start %s there: %s", link.spec.label, task.run_id, exc)
        return link, str(exc)

    def _busy(self) -> str:
        down = [lk.spec.label for lk in self.links.values() if lk.down_until > time.time()]
        return f"{len(self.links) - len(down) - len(self.refused)} host(s) busy" + (
            f", down: {', '.join(down)}" if down else ""
        )

    def _free_slots(self, avoid: str) -> builtins.list[tuple[Link, int]]:
        """(host, free slot) for each usable host, the least busy first, the previous attempt's host last."""
        found = []
        for label, link in self.links.items():
            if label in self.refused or link.down_until > time.time():
                continue
            facts = self._facts(link)
            if facts is None:
                continue
            taken = {p.slot for p in self.seen.get(label, {}).values()}
            free = [s for s in range(probe.slots(link.spec, facts, self.gpus_per_run)) if s not in taken]
            if free:
                found.append((label == avoid, len(taken), label, link, free[0]))
        return [(link, slot) for *_k, link, slot in sorted(found, key=lambda f: f[:3])]

    def _facts(self, link: Link) -> probe.Facts | None:
        label = link.spec.label
        if label not in self.facts:
            try:
                self.facts[label] = probe.probe(link, self.gpus_per_run)
            except HostDown:
                return None
            except OrchError as exc:
                self.refused[label] = str(exc)
                log.warning("%s", exc)
                return None
        return self.facts[label]

    def _start_on(self, link: Link, slot: int, task: RunTask) -> None:
        facts = self.facts[link.spec.label]
        self._serve(link)
        bundle = self._install(link)
        env = {**task.env, "ORCH_PYTHON": facts.python}
        if self.gpus_per_run:
            first = slot * self.gpus_per_run
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(self.gpus_per_run))
        task = replace(task, env=env, store_url="tunnel:" + tunnel_file(self.sweep.spec.name))
        task_path = contract.task_file(task.ctl_dir, task.attempt)
        link.put_bytes(task.to_json(), task_path)
        agent = contract.agent_command(facts.python, task_path, task.ctl_dir, pythonpath=bundle.remote_dir)
        link.check(sessions.start_command(task, agent, Placed(task.attempt, slot, task.node_rank, task.node_hosts)))
        log.info(
            "%s: attempt %s node %s on %s (slot %s)", task.run_id, task.attempt, task.node_rank, link.spec.label, slot
        )

    def _install(self, link: Link) -> code_bundle.Bundle:
        if self.bundle is None:
            self.bundle = code_bundle.build()
        b = self.bundle
        if link.spec.label not in self.installed:
            if link.run(f'test -f "{b.remote_dir.replace("~/", "$HOME/")}/.complete"').code != 0:
                link.check(code_bundle.install_command(b), timeout=120, stdin=b.data)
            self.installed.add(link.spec.label)
        return b

    def _serve(self, link: Link) -> None:
        """The store server (once per controller) and this host's way to it (once per connection)."""
        if self.server is None:
            from orchestrator.backends.ssh.server import StoreServer
            from orchestrator.store import open_store

            mirror = orch_home() / "ssh-mirror" / self.sweep.spec.name
            self.server = StoreServer(open_store(self.sweep.store_url), self.sweep.spec.name, mirror)
        link.tunnel(self.sweep.spec.name, self.server.port, self.server.token)

    def _ledger(self) -> Ledger:
        if self.ledger.store is None:
            from orchestrator.store import open_store

            self.ledger.store = open_store(self.sweep.store_url)
        return self.ledger

    def spend(self) -> float:
        return self._ledger().spend()

    def flush(self) -> None:
        self._ledger().flush()

    def learn(self, statuses) -> None:
        """Each pass of the controller: every host with live runs has its way to the store (a relaunched controller,
        a host that came back); what the runs held is written when it changed."""
        self.flush()
        for label, runs in self.seen.items():
            link = self.links[label]
            if runs and link.down_until <= time.time():
                try:
                    self._serve(link)
                except (HostDown, OrchError) as exc:
                    log.debug("%s: no tunnel now: %s", label, exc)

    def drain_outcomes(self) -> builtins.list[Outcome]:
        out = []
        while not self.outcomes.empty():
            out.append(self.outcomes.get())
        return out

    # --- stopping -------------------------------------------------------------------------------------------------

    def _holders(self, run_id: str) -> builtins.list[Link]:
        """The hosts of the run's newest attempt, node 0 first (listed now when this process has not yet)."""
        if not self.seen:
            self.list()
        found = [
            (p.attempt, -p.node, label) for label, runs in self.seen.items() for r, p in runs.items() if r == run_id
        ]
        newest = max((a for a, _n, _l in found), default=0)
        return [self.links[label] for a, _n, label in sorted(found, reverse=True) if a == newest]

    def _where(self, run_id: str) -> Link | None:
        holders = self._holders(run_id)
        return holders[0] if holders else None

    def release(self, host: Host) -> None:
        if host.host_id == ACQUIRING or host.host_id not in self.links:
            return
        link = self.links[host.host_id]
        # forgotten here either way: a host that does not answer shows its runs again only once it answers (then an
        # old attempt's session is released again, and ends)
        self.seen.get(host.host_id, {}).pop(host.run_id, None)
        try:
            link.run(sessions.kill_script(self.session(host.run_id)))
        except (HostDown, OrchError) as exc:
            log.info("%s: could not end %s there now: %s", host.host_id, host.run_id, exc)

    def stop(self, run_id: str, reason: StopReason) -> bool:
        """Every node's agent stops its command, node 0 first (it records the reason)."""
        holders = self._holders(run_id)
        ctl = contract.ctl_dir(BASE, self.sweep.spec.name, run_id)
        for link in holders:
            try:
                self._serve(link)  # its agent's last record and checkpoint go to the store through this process now
                r = link.run(
                    contract.stop_script(ctl, self.session(run_id), reason, STOP_WAIT_S, SOCKET),
                    timeout=STOP_WAIT_S + 15,
                )
                if r.code != 0:
                    link.run(sessions.kill_script(self.session(run_id)))
            except (HostDown, OrchError) as exc:
                log.warning("could not stop %s on %s: %s", run_id, link.spec.label, exc)
                continue
            self.seen.get(link.spec.label, {}).pop(run_id, None)
        return bool(holders)

    def notify_interruption(self, run_id: str) -> bool:
        link = self._where(run_id)
        if link is None:
            return False
        link.put_bytes(b"chaos\n", contract.notice_path(contract.ctl_dir(BASE, self.sweep.spec.name, run_id)), 0o644)
        return True

    def attach(self, run_id: str, node: int = 0) -> int:
        holders = self._holders(run_id)
        if not holders:
            raise OrchError(f"run {run_id} is not running on any host now. See its log with `orch logs {run_id}`.")
        if node >= len(holders):
            raise OrchError(f"run {run_id} runs on {len(holders)} node(s) now: --node takes 0 to {len(holders) - 1}.")
        link = holders[node]
        remote = f"tmux -L {SOCKET} attach-session -t {shlex.quote('=' + self.session(run_id) + ':run')}"
        if shutil.which("ssh") is None:
            raise OrchError("`orch attach` on ssh hosts needs the ssh command (apt-get install openssh-client).")
        argv = sessions.attach_argv(link.spec, self.settings.known_hosts, self.settings.key, remote)
        os.execvp(argv[0], argv)
        return 0

    # --- the sweep's lifetime ------------------------------------------------------------------------------------

    def plan(self) -> dict | None:
        """`--dry-run`: every host probed (read-only: one command each), what it offers this sweep or why not."""
        links = list(self.links.values())
        with ThreadPoolExecutor(min(16, len(links))) as pool:
            list(pool.map(self._facts, links))
        hosts = []
        for label, link in self.links.items():
            facts = self.facts.get(label)
            if facts is not None and label not in self.refused:
                slots = probe.slots(link.spec, facts, self.gpus_per_run)
                hosts.append({"host": label, "gpus": facts.gpus, "slots": slots, "python": facts.python})
            else:
                hosts.append({"host": label, "why": self.refused.get(label) or link.why_down or "did not answer"})
        return {"hosts": hosts, "price_per_hour": self.settings.price_per_hour}

    def preflight(self) -> None:
        """Every host probed at launch (in parallel). One that cannot serve (a wrong key, no Python or tmux, a full
        disk) is named with the fix and left out; one that does not answer is named and asked again later (it may be
        booting). None usable now: nothing starts."""
        links = list(self.links.values())
        with ThreadPoolExecutor(min(16, len(links))) as pool:
            list(pool.map(self._facts, links))
        quiet = {
            label: f"{label}: {link.why_down or 'did not answer'}; asked again every {DOWN_S:.0f} s"
            for label, link in self.links.items()
            if label not in self.facts and label not in self.refused
        }
        if not self.facts:
            raise OrchError(
                "no host can run this sweep:\n  " + "\n  ".join([*self.refused.values(), *quiet.values()]),
                exit_code=2,
            )
        for why in self.refused.values():
            log.warning("left out: %s", why)
        for why in quiet.values():
            log.warning("not answering: %s", why)

    def teardown(self) -> builtins.list[str]:
        """What orch put on each host for this sweep: its runs' folders and its tunnel file (the code caches
        ~/orch/code and ~/orch/runs/.code stay, shared by sweeps; see docs/ssh.md)."""
        gone = []
        name = self.sweep.spec.name
        for label, link in self.links.items():
            script = sessions.kill_script(contract.session_prefix(name), every=True) + (
                f'; rm -rf "$HOME/orch/runs/{name}" "$HOME/orch/tunnels/{name}.json"'
            )
            try:
                link.check(script, timeout=60)
                gone.append(f"{label}: ~/orch/runs/{name}")
            except (HostDown, OrchError) as exc:
                log.warning("%s: could not remove what the sweep left there: %s", label, exc)
        if self.server is not None:
            self.server.forget()
        self.list()  # what ended on the hosts that answered is in the ledger
        self.flush()
        return gone
