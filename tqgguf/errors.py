"""Errors that the CLI turns into one line and an exit code, never a traceback."""

from __future__ import annotations

# Exit codes shared by every command.
EXIT_OK = 0
EXIT_WARN = 1  # usable, with warnings (check) / a step failed (build, patches)
EXIT_ERROR = 2  # bad input, unreadable or unsupported


class TqError(Exception):
    """A failure the user can act on: `message` says what happened, `hint` what to do."""

    def __init__(self, message: str, hint: str | None = None, code: int = EXIT_ERROR):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"
