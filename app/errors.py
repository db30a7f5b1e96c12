"""One error base for everything hangscope reports to a user: a title, the detail, and a remedy hint."""

from __future__ import annotations


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
    """A node-level failure, classified with a code from workers.protocol.ERROR_HINTS."""

    title = "node failed"

    def __init__(self, code: str, message: str, *, phase: str = "", hint: str | None = None) -> None:
        from workers.protocol import ERROR_HINTS

        super().__init__(message, hint=hint if hint is not None else ERROR_HINTS.get(code, ""))
        self.code = code
        self.phase = phase
