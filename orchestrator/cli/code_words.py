"""What a launch and its dry run say of `workdir:` and `setup:` (control/code.py takes the snapshot)."""

from __future__ import annotations


def code_lines(snapshot, setup: str = "") -> list[str]:
    """`workdir:`: what goes to every host (its size, digest, git state), what was left out, and `setup:`."""
    if snapshot is None:
        return ["code: no workdir (each run's command starts in its run folder)"]
    git = ""
    if snapshot.git_commit:
        git = f", git {snapshot.git_commit[:10]}" + (" with uncommitted changes" if snapshot.git_dirty else "")
    out = [
        f"code: {snapshot.root}: {len(snapshot.files)} files, {_mb(snapshot.size)} ({_mb(len(snapshot.data))} "
        f"packed), snapshot {snapshot.digest}{git}; each run starts in it (read-only; write to $ORCH_RUN_DIR)"
    ]
    if snapshot.left_out:
        shown = ", ".join(snapshot.left_out[:8]) + (" ..." if len(snapshot.left_out) > 8 else "")
        out.append(f"code: left out, as they look like secrets: {shown} (pass secrets with `env:`)")
    if setup:
        out.append(f"setup (once per host, in the workdir): {setup}")
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"
