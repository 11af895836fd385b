"""The nafix error hierarchy.

Every message is a whole sentence that names where the problem is (a file, a node, a YAML path),
so the CLI can print it after ``error:`` without a traceback.
"""

from __future__ import annotations


class NafixError(Exception):
    """Base class of every error nafix raises on purpose.

    ``exit_code`` is what the CLI exits with: 2 for bad input or usage, 1 for a failed check.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class InputError(NafixError):
    """The model file (or another input file) cannot be used as given."""


class UsageError(NafixError):
    """The options given on the command line or to the API do not fit together."""


class OutputError(UsageError):
    """An output file cannot or must not be written (it is an input, somebody else's file,
    read-only, or its folder is not writable)."""


class RuleError(NafixError):
    """A rule file under rules/ (or --rules DIR) is invalid."""


class ProfileError(NafixError):
    """A target profile, .mpool or Neural-ART profile JSON file is invalid."""


class ToolError(NafixError):
    """An external tool (stedgeai, atonn) could not be found or run as asked."""


class VerificationError(NafixError):
    """The rewritten model does not compute what the original computed."""

    exit_code = 1
