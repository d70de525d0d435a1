"""Expected errors: the CLI prints their message (what failed, then what to do) with no traceback."""


class OrchError(Exception):
    """An expected failure; `exit_code` is what the CLI exits with."""

    exit_code = 1


class SpecError(OrchError):
    """The sweep file is unreadable or invalid. Nothing has been launched."""

    exit_code = 2


class NotFound(OrchError):
    """A sweep or run the user named does not exist."""

    exit_code = 2
