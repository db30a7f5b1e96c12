"""One error base for everything hangscope reports to a user: a title, the detail, and a remedy hint.

One subclass per failure class, each carrying its title and remedy: bad input (InputError, HostsError), a node
that failed (TransportError, its remedy from its code), and, beside their code, SnapshotFormatError
(app.model), WriteError (app.cli.run), SlurmError (app.slurm.job), NoInterpreterError and GpusBusyError
(app.gpu). The TUI shows every one of them in one place (app.ui.core.HangscopeCore.show_error), the command
line in app.cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from app.model import ErrorInfo
    from workers.protocol import ErrorCode


def remote_code(value: Any) -> "ErrorCode":
    """An error code as a worker sent it: remote text, kept as sent (a newer worker may send a code this
    version does not know; hint_for gives it no remedy then); "internal" when there is none."""
    return cast("ErrorCode", str(value or "internal"))


def hint_for(code: str) -> str:
    """The remedy a user reads for an error code (workers.protocol.ERROR_HINTS), "" for a code not in it."""
    from workers.protocol import ERROR_HINTS

    return ERROR_HINTS.get(code, "")


class HangscopeError(Exception):
    """Base of all user-facing errors. `title` is a short headline, `hint` says what to do."""

    title = "hangscope error"
    hint = ""
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, title: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if hint is not None:
            self.hint = hint
        if title is not None:
            self.title = title

    def __str__(self) -> str:
        return self.message


class InputError(HangscopeError):
    """Bad input from the user (hosts file, arguments, snapshot file): exit code 2, nothing connected."""

    title = "bad input"
    exit_code = 2


class HostsError(InputError):
    """A hosts file or node list that cannot be used, with the place and text that is wrong."""

    title = "bad hosts input"

    def __init__(self, source: str, line: int | None, text: str, reason: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        shown = f": {text!r}" if text else ""
        super().__init__(f"{where}: {reason}{shown}")
        self.source = source
        self.line = line
        self.text = text
        self.reason = reason


class TransportError(HangscopeError):
    """A node-level failure, classified with a code from workers.protocol.ERROR_HINTS (its remedy unless `hint`
    says otherwise)."""

    title = "node failed"

    def __init__(self, code: "ErrorCode", message: str, *, phase: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint or hint_for(code))
        self.code: ErrorCode = code
        self.phase = phase

    def info(self, phase: str | None = None) -> "ErrorInfo":
        """As the model records it on a node or a rank, in `phase` (default: the error's own)."""
        from app.model import ErrorInfo

        return ErrorInfo(code=self.code, message=self.message, hint=self.hint,
                         phase=self.phase if phase is None else phase)
