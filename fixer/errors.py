"""The nafix error hierarchy.

Every message is a whole sentence that names where the problem is (a file, a node, a YAML path),
so the CLI can print it after ``error:`` without a traceback.
"""

from __future__ import annotations

import os


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


def yaml_error_sentence(where: str, exc: BaseException) -> str:
    """A YAML parse error as one sentence naming the file and the line (PyYAML's own message spans
    several lines with a caret drawing)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    if problem is None:
        problem = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    if mark is not None:
        return f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML ({problem})."
    return f"{where}: not valid YAML ({problem})."


def read_yaml(path, where: str, error: type[NafixError]):
    """``yaml.safe_load`` of the text file at ``path`` (or of ``path`` itself when it is a ``str``
    holding the text); every failure (unreadable, binary, invalid or absurdly nested YAML) is one
    ``error`` sentence naming ``where``."""
    import yaml

    if isinstance(path, str):
        text = path
    else:
        try:
            from .fsutil import read_bytes

            raw = read_bytes(path) if isinstance(path, (os.PathLike, bytes)) else path.read_bytes()
        except OSError as exc:
            raise error(f"{where}: cannot be read ({exc.strerror or exc}).") from None
        if b"\x00" in raw[:8192]:
            raise error(f"{where}: is a binary file, not YAML text.")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: is not UTF-8 text (byte {exc.start}), so not a YAML file.") from None
    try:
        # libyaml's C parser when PyYAML has it: the same safe constructors, ~10x faster (the
        # pure-Python parser took ~0.4 s for the built-in profile, once per command).
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loader
    except yaml.YAMLError as exc:
        raise error(yaml_error_sentence(where, exc)) from None
    except RecursionError:
        raise error(f"{where}: the YAML is nested too deeply to read.") from None
