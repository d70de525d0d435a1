"""Loaded by Python at start-up (this folder on PYTHONPATH) by tests/unit/cli/test_main.py. Once orch's CLI is being
imported, every exec() of a function's source text (as dataclasses make their methods) is followed by one that raises
KeyboardInterrupt, caught here: as when a Ctrl-C, SIGTERM or SIGHUP lands while a dataclass is being made during a lazy
import and orch catches the KeyboardInterrupt further up."""

import builtins
import sys

_exec = builtins.exec
caught = []


def _exec_then_a_caught_interrupt(source, *args, **kwargs):
    result = _exec(source, *args, **kwargs)
    if isinstance(source, str) and "def " in source and "orchestrator.cli" in sys.modules:
        try:
            _exec("raise KeyboardInterrupt")
        except KeyboardInterrupt:
            caught.append(True)
    return result


builtins.exec = _exec_then_a_caught_interrupt
