"""Backends turn a run into a process on some host: this machine (`local`, tmux through
`tmux_server`) or EC2 spot instances (`aws/`). They compose the parts below them and differ only in
primitives (run on a host, put a file, list, acquire, release); `base` holds the interface and the
dataclasses that cross it, `bundle` the code shipped to hosts, `registry` one entry per backend (its name,
settings section, checks, cost reader; docs/backends.md adds one) and the loading of sweeps against them.

May import `aws`, `host`, `remote`, `store`, `sweep`, `contract`, `errors`, `wait`; never `control`
or `cli`.
"""
