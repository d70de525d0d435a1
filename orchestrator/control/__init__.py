"""The user's machine: the reconcile loop (controller.py; a pure `decide()` over observed runs in decide.py, the
verdicts a pass writes in verdicts.py, launch's checks of the sweep's record in recorded.py, what a relaunch that
raises the budget or max_restarts gives back in raised.py), the local state cache
and lock, `collect` (results, CSVs, plots, cost), and `orch launch` as process control (launch.py: the lock,
the lease, signals, the hand-off, the background controller; it tells the CLI what happens through events).

May import `backends` (a backend's parts only through its registry entry), `store`, `sweep`, `contract`, `errors`,
`wait`; never `cli`; nothing here prints (the CLI renders what these return).
"""
