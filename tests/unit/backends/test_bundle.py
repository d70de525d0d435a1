"""The code bundle's install on a host: runs packed on one instance install it at the same moment, and a folder an
interrupted install left half-written is replaced, never trusted."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from orchestrator.backends import bundle
from orchestrator.wait import retry_until


def _install(home: Path, b: bundle.Bundle) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", bundle.install_command(b)],
        input=b.data,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        timeout=120,
    )


def _waiting_on_a_lock(path: Path) -> bool:
    """Whether /proc/locks shows a process blocked on a lock of `path` (its lines with `->`)."""
    st = path.stat()
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any("->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def test_a_run_installing_the_bundle_while_another_is_half_way_waits_for_it(tmp_path):
    """Two runs packed on one instance start together: the second must not return (and start its agent) while the
    first is still writing the files, nor trip over them (GNU tar: `Cannot open: File exists`)."""
    b = bundle.build()
    shipped = {name for _, name in bundle._sources(Path(bundle.__file__).resolve().parents[2])}
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    cmd = ["bash", "-c", bundle.install_command(b)]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, stderr=subprocess.PIPE)
    first.stdin.write(b.data[: len(b.data) // 2])  # half the tarball: the first install stops half-way
    first.stdin.flush()
    folder = tmp_path / "orch" / "code" / b.digest
    retry_until(lambda: folder.is_dir(), 60, 0.01, "the first install to begin")
    second = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, stderr=subprocess.PIPE)
    feeding = threading.Thread(target=lambda: (second.stdin.write(b.data), second.stdin.close()))
    feeding.start()  # more than a pipe holds: a waiting install reads none of it yet
    lock = folder.parent / f"{b.digest}.lock"
    waited = retry_until(
        lambda: "returned" if second.poll() is not None else lock.exists() and _waiting_on_a_lock(lock) and "waits",
        60,
        0.01,
        "the second install to wait or return",
    )
    assert waited == "waits", f"the second install returned while the first was half-way: {second.stderr.read()!r}"
    first.stdin.write(b.data[len(b.data) // 2 :])
    first.stdin.close()
    feeding.join()
    assert first.wait(60) == 0 and second.wait(60) == 0, (first.stderr.read(), second.stderr.read())
    assert {str(p.relative_to(folder)) for p in folder.rglob("*.py")} == shipped
    assert (folder / ".complete").exists()
    again = _install(tmp_path, b)  # installed: the data is read and dropped
    assert again.returncode == 0 and again.stderr == b""


def test_a_half_written_bundle_folder_is_replaced(tmp_path):
    b = bundle.build()
    partial = tmp_path / "orch" / "code" / b.digest / "orchestrator"
    partial.mkdir(parents=True)
    (partial / "contract.py").write_text("# cut off mid-write\n")
    r = _install(tmp_path, b)
    assert r.returncode == 0, r.stderr.decode()
    assert (partial / "contract.py").read_text() != "# cut off mid-write\n"
    assert (tmp_path / "orch" / "code" / b.digest / ".complete").exists()
