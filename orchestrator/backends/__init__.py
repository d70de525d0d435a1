"""Backends turn a run into a process on some host, one package each: this machine (`local/`, tmux through
`local/tmux_server`), EC2 spot instances (`aws/`, with its EC2/IAM calls in `aws/cloud/` and its host-side parts
in host/aws/), or machines the user already has (`ssh/`, its host-side store in store/tunneled.py). They compose
the parts below them and differ only in primitives (run on a host, put a file, list, acquire, release); `base`
holds the interface and the dataclasses that cross it, `bundle` the code shipped to hosts, `registry` one entry
per backend (its name, settings section, checks, cost reader; docs/backends.md adds one) and the loading of
sweeps against them.

May import `host`, `remote`, `store`, `sweep`, `contract`, `errors`, `wait`; never `control` or `cli`. Each
backend's package stands apart: `local/`, `aws/` and `ssh/` import nothing of each other, and outside `aws/` only
the registry's aws entry and the aws backend's own commands (cli/aws.py, cli/ami.py, cli/remote.py) import
`aws/cloud/` (import-linter checks both).
"""
