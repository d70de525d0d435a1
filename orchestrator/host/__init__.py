"""What runs on the instance (or, locally, beside the controller): the agent that supervises one
attempt, its watch (small periodic checks, one job each), its reporter (record + heartbeat), the run
folder and the store (folder.py: restore, stage, sync up), notice sources (IMDS or a control file) and the
stop file, the host policy (terminate itself when done), what a command leaves running (leftovers.py), nodes of a
multi-node run, data staging, tmux helpers. The parts only the aws backend switches on are in `aws/`: IMDS and
terminating the instance (imds.py), the instance's own tags (tags.py), the GPU slots of a shared instance (slots.py).

The code bundle ships this package (`aws/` included) with `store/`, `contract.py`, `errors.py` and `wait.py`, and
nothing else of orchestrator: it imports nothing from `control`, `cli`, `backends`, `remote` or `sweep`
(import-linter checks it; tests/repo/test_layers.py checks the bundle).
"""
