"""How a user names a machine to log in to (`[user@]host[:port]`), as the ssh backend's hosts and Slurm's login node
are written in sweep.yaml: a pattern only, so that reading a sweep file imports no SSH library."""

from __future__ import annotations

import re

HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d+))?$"
)
