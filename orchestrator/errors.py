"""Expected errors: the CLI prints their message (what failed, then what to do) with no traceback."""


class OrchError(Exception):
    """An expected failure; `exit_code` is what the CLI exits with (1, or 2 for bad input)."""

    exit_code = 1

    def __init__(self, message: str = "", exit_code: int = 0):
        super().__init__(message)
        if exit_code:
            self.exit_code = exit_code


class SpecError(OrchError):
    """The sweep file is unreadable or invalid. Nothing has been launched."""

    exit_code = 2


class NotFound(OrchError):
    """A sweep or run the user named does not exist."""

    exit_code = 2
