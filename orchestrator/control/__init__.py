"""The user's machine: the reconcile loop (a pure `decide()` over observed runs), the local state cache
and lock, and `collect` (results, CSVs, plots, cost).

May import `backends`, `aws`, `store`, `sweep`, `contract`, `errors`, `wait`; never `cli`; nothing
here prints (the CLI renders what these return).
"""
