"""`python -m orchestrator.cli` is `orch` (the background controller, the remote controller's units and the
notifier start it this way).

Run as `-m`, CPython (3.11) ends the process with SIGINT (exit status -2 to its parent, 130 to a shell) when a
KeyboardInterrupt was raised inside any exec() or eval() of source text during the run, even one that was caught: its
"unhandled KeyboardInterrupt" flag is set by the inner exec and never cleared (`python -m` checks it on the way out; a
script such as the `orch` entry point exits before that check). A Ctrl-C, SIGTERM or SIGHUP that lands while a
dataclass is being made (dataclasses exec their methods' source; a lazy import does that mid-run) was such a one:
`orch launch` handed the sweep over as it should, printed "detached", and its parent saw it killed by SIGINT. Every
exec of source text clears the flag as it starts, so an empty one after the command clears a stale one; a
KeyboardInterrupt that really escapes sets it again on its way out.
"""

from orchestrator.cli.main import main

try:
    main()
finally:
    exec("")  # clears CPython's stale "unhandled KeyboardInterrupt" flag (see above)
