"""The `ssh:` section as `orch launch` reads it: what is wrong is named with file:line and the fix, exit 2, no
traceback, nothing launched."""

from __future__ import annotations

import pytest

from tests.conftest import no_traceback


@pytest.mark.parametrize(
    ("section", "line", "says"),
    [
        ("ssh:\n  hosts: []\n", 4, "ssh.hosts"),
        ("ssh:\n  hosts: ['alice@gpu1:22:33']\n", 5, "is not `[user@]host[:port]`"),
        ("ssh:\n  hosts: [gpu1, 'me@gpu1:22']\n  user: me\n  known_hosts: KNOWN\n", 5, "same machine as hosts[0]"),
        ("ssh:\n  hosts: [gpu1]\n  known_hosts: /nonexistent/known\n", 6, "orch checks every host's key against it"),
        ("ssh:\n  hosts: [gpu1]\n  key: /nonexistent/id\n  known_hosts: KNOWN\n", 6, "no such file"),
        ("ssh:\n  hosts: [gpu1]\n  known_hosts: KNOWN\nbudget_usd: 5\n", 7, "ssh.price_per_hour"),
        ("resources:\n  nodes: 3\nssh:\n  hosts: [gpu1, gpu2]\n  known_hosts: KNOWN\n", 5, "needs 3 hosts at once"),
        ("ssh:\n  hosts: [gpu1]\n  known_hosts: KNOWN\n  identity: ~/.ssh/x\n", 7, "identity"),
    ],
)
def test_a_wrong_ssh_section_is_refused_with_where_and_the_fix(orch, tmp_path, section, line, says):
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = orch.sweep('name: bad\ncommand: "true"\nbackend: ssh\n' + section.replace("KNOWN", str(known)))
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2, r.out + r.err
    no_traceback(r)
    assert "sweep.yaml:" in r.err and says in r.err, r.err
    assert not (orch.home / "logs").exists() or not list((orch.home / "logs").glob("bad*"))


def test_no_ssh_section_says_what_to_write(orch):
    path = orch.sweep('name: bare\ncommand: "true"\nbackend: ssh\n')
    r = orch("launch", str(path), "--dry-run")
    assert r.code == 2 and "needs an `ssh:` section with `hosts:`" in r.err, r.err
