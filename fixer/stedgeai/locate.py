"""Discovery of ST Edge AI Core: :func:`find_stedgeai` (explicit path, ``$STEDGEAI_CORE_DIR``, ``PATH``)
and its version (:func:`stedgeai_version`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..errors import ToolError

log = logging.getLogger(__name__)

#: ``sys.platform`` prefix -> (folder under ``$STEDGEAI_CORE_DIR/Utilities``, executable name),
#: as ST Edge AI Core lays out its installation (``Utilities/windows/stedgeai.exe`` is OBS in a
#: published log; ``linux`` OBS in published paths; ``mac`` DOC).
_UTILITIES_FOLDERS: tuple[tuple[str, str, str], ...] = (
    ("linux", "linux", "stedgeai"),
    ("win32", "windows", "stedgeai.exe"),
    ("cygwin", "windows", "stedgeai.exe"),
    ("darwin", "mac", "stedgeai"),
)

_VERSION_RE = re.compile(r"ST Edge AI Core\s+v?(?P<version>\d+\.\d+\.\d+(?:-\d+)?)")


def _utilities_folder(platform: str) -> tuple[str, str]:
    for prefix, folder, exe in _UTILITIES_FOLDERS:
        if platform.startswith(prefix):
            return folder, exe
    return "linux", "stedgeai"


def find_stedgeai(
    explicit: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    platform: str | None = None,
) -> Path | None:
    """Locate the ``stedgeai`` executable, or return None when it is not installed.

    The search order is: the ``explicit`` path when given (it must exist: a missing explicit
    path is an error, not a reason to look elsewhere), then
    ``$STEDGEAI_CORE_DIR/Utilities/<os>/stedgeai`` (``<os>`` is ``linux``, ``windows`` with
    ``stedgeai.exe``, or ``mac``), then ``stedgeai`` on ``PATH``. ``env`` replaces ``os.environ``
    for the last two steps (``PATH`` included); ``platform`` replaces ``sys.platform``.
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.exists():
            raise ToolError(f"The stedgeai executable given as '{explicit}' does not exist.")
        if path.is_dir():
            raise ToolError(
                f"The stedgeai path '{explicit}' is a folder; give the executable itself, e.g. "
                f"'{path / 'Utilities' / _utilities_folder(platform or sys.platform)[0]}"
                f"/{_utilities_folder(platform or sys.platform)[1]}'."
            )
        if os.name == "posix" and not os.access(path, os.X_OK):
            raise ToolError(f"The stedgeai file '{explicit}' exists but is not executable.")
        log.debug("stedgeai: using the explicit path %s", path)
        return path

    environ: Mapping[str, str] = os.environ if env is None else env
    folder, exe = _utilities_folder(platform or sys.platform)
    core_dir = environ.get("STEDGEAI_CORE_DIR")
    if core_dir:
        candidate = Path(core_dir).expanduser() / "Utilities" / folder / exe
        if candidate.is_file():
            log.debug("stedgeai: found %s through STEDGEAI_CORE_DIR", candidate)
            return candidate
        log.warning(
            "STEDGEAI_CORE_DIR is set to '%s' but '%s' does not exist; looking on PATH instead.",
            core_dir,
            candidate,
        )
    found = shutil.which("stedgeai", path=environ.get("PATH", ""))
    if found:
        log.debug("stedgeai: found %s on PATH", found)
        return Path(found)
    return None


def parse_version(text: str) -> str | None:
    """Return the version in a line like ``ST Edge AI Core v2.1.0-20194 329b0e98d``
    (``"2.1.0-20194"``), or None when the text has no such line."""
    match = _VERSION_RE.search(text)
    return match.group("version") if match else None


def stedgeai_version(path: str | Path, *, timeout: float = 60.0) -> str:
    """Run ``stedgeai --version`` and return its version, e.g. ``"2.1.0-20194"``.

    The output goes to a temporary file (not a pipe a child process could keep open) and on a
    timeout the whole process group is killed, so this returns within about ``timeout`` seconds.
    """
    import signal
    import tempfile

    with tempfile.TemporaryFile() as sink:
        try:
            process = subprocess.Popen([str(path), "--version"], stdin=subprocess.DEVNULL, stdout=sink,
                                       stderr=subprocess.STDOUT, start_new_session=os.name == "posix")
        except OSError as exc:
            raise ToolError(f"'{path}' could not be started: {exc.strerror or exc}.") from exc
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                if os.name == "posix":
                    os.killpg(process.pid, signal.SIGKILL)
                process.kill()
            except OSError:
                pass
            process.wait()
            raise ToolError(f"'{path} --version' did not finish within {timeout:g} s.") from None
        except BaseException:
            process.kill()
            process.wait()
            raise
        sink.seek(0)
        text = sink.read().decode("utf-8", errors="replace")
    version = parse_version(text)
    if version is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise ToolError(
            f"'{path} --version' (exit code {returncode}) did not print a line like "
            f"'ST Edge AI Core v2.1.0-20194'; its first line was '{first[:200]}'."
        )
    return version
