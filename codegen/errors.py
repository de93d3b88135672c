"""Diagnostics for codegen: source locations, spec errors and the error collector.

Every user mistake becomes a `SpecError` with a `Location` (file, line, col)
and is printed compiler-style (`file:line:col: error: message`). Stages add
errors to a `Diagnostics` collector and keep going so that one run reports
all errors together, sorted. This module must not know about YAML, Jinja or
the model. Called by every other codegen module and by the CLI.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Location:
    """A position in a source file; `line` and `col` are 1-based (0 = unknown)."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line <= 0:
            return self.file
        if self.col <= 0:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.col}"

    def short(self) -> str:
        """`file:line`, the form used in manifests and provenance headers."""
        return f"{self.file}:{self.line}" if self.line > 0 else self.file

    def shifted(self, lines: int = 0, col: int | None = None) -> Location:
        """This location moved down `lines` lines, optionally at another column."""
        return Location(self.file, self.line + lines, self.col if col is None else col)


@dataclass(frozen=True, order=True)
class SpecError(Exception):
    """One user error: where, what was expected, how to fix it, and optional notes."""

    location: Location
    message: str
    notes: tuple[str, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        text = f"{self.location}: error: {self.message}"
        for note in self.notes:
            text += f"\n  note: {note}"
        return text


class DiagnosticsError(Exception):
    """Raised to stop a run after errors were collected; carries the sorted errors."""

    def __init__(self, errors: list[SpecError]):
        super().__init__("\n".join(str(e) for e in errors))
        self.errors = errors


class Diagnostics:
    """Collects errors of a run; `check()` raises `DiagnosticsError` if there are any."""

    def __init__(self) -> None:
        self._errors: dict[tuple[Location, str], SpecError] = {}

    def error(self, location: Location, message: str, *notes: str) -> None:
        """Records an error (an identical location + message is recorded once)."""
        key = (location, message)
        if key not in self._errors:
            self._errors[key] = SpecError(location, message, tuple(notes))

    def add(self, errors) -> None:
        """Records `SpecError`s produced by a pure stage."""
        for e in errors:
            self.error(e.location, e.message, *e.notes)

    def __bool__(self) -> bool:
        return bool(self._errors)

    def __len__(self) -> int:
        return len(self._errors)

    @property
    def errors(self) -> list[SpecError]:
        """The errors sorted by file, line, column and message."""
        return sorted(self._errors.values())

    def check(self) -> None:
        """Raises `DiagnosticsError` if any error was recorded."""
        if self._errors:
            raise DiagnosticsError(self.errors)


def format_errors(errors: list[SpecError]) -> str:
    """The compiler-style text of errors plus a count line."""
    lines = [str(e) for e in errors]
    n = len(errors)
    lines.append(f"{n} error{'s' if n != 1 else ''}")
    return "\n".join(lines) + "\n"


def report(errors: list[SpecError], stream=None) -> int:
    """Prints errors to stderr and returns the exit status 1."""
    (stream or sys.stderr).write(format_errors(errors))
    return 1


def did_you_mean(word: str, choices) -> str:
    """` (did you mean 'x'?)` for the closest choice, or an empty string."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
