"""Backends turn a run into a process on some host: this machine (`local`, tmux through
`tmux_server`) or EC2 spot instances (`aws/`, with its EC2/IAM calls in `aws/cloud/` and its host-side parts in
host/aws/). They compose the parts below them and differ only in primitives (run on a host, put a file, list,
acquire, release); `base` holds the interface and the dataclasses that cross it, `bundle` the code shipped to hosts,
`registry` one entry per backend (its name, settings section, checks, cost reader; docs/backends.md adds one) and the
loading of sweeps against them.

May import `host`, `remote`, `store`, `sweep`, `contract`, `errors`, `wait`; never `control` or `cli`. Each
backend's package stands apart: `aws/` and the local backend's modules (`local`, `local_settings`, `tmux_server`)
import nothing of each other, and outside `aws/` only the registry's aws entry and the aws backend's own commands
(cli/aws.py, cli/ami.py, cli/remote.py) import `aws/cloud/` (import-linter checks both).
"""
