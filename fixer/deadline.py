"""A time limit on every stage of a command that runs foreign code (onnxruntime, the TFLite
interpreter), the way ``audit`` bounds each model: the work runs in a child process and the parent
stops it when a stage outlives the limit.

Native code cannot be interrupted from Python (a Loop that onnxruntime runs 10^15 times never
returns to the interpreter, and no signal handler runs meanwhile), so the limit is kept by a parent
process that only waits. The work marks its stages with :func:`stage`; the clock restarts at each
mark, and a stage marked ``timed=False`` (writing files, stedgeai, which has its own timeout) has
no limit. Outside :func:`run_bounded` :func:`stage` does nothing.

The child is forked, so it shares the caller's open files (stdout, stderr) and state. Forking is
only done where it is safe (see :func:`can_bound`): on POSIX, from a process with one thread whose
onnxruntime is not loaded yet (a process that created onnxruntime's thread pools must not fork) and
whose stdout/stderr are the real ones (the child writes to them directly). Elsewhere the work runs
in the caller's process, without a limit.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import InputError, NafixError

T = TypeVar("T")

_notify: Callable[[str, bool], None] | None = None


class StageTimeout(InputError):
    """A stage of a bounded command did not finish within its time limit and was stopped."""


def stage(name: str, *, timed: bool = True) -> None:
    """Start the stage called ``name`` (e.g. "verification (onnxruntime)"): the time limit starts
    again; ``timed=False``: no limit until the next stage. Does nothing outside :func:`run_bounded`."""
    if _notify is not None:
        _notify(name, timed)


def can_bound() -> bool:
    """True where :func:`run_bounded` forks its child (see the module docstring)."""
    return (
        os.name == "posix"
        and hasattr(os, "fork")
        and "onnxruntime" not in sys.modules
        and threading.active_count() == 1
        and getattr(sys.stdout, "nafix_wrapped", sys.stdout) is sys.__stdout__
        and getattr(sys.stderr, "nafix_wrapped", sys.stderr) is sys.__stderr__
    )


def _child(conn, fn: Callable[[], Any], tmp: str) -> None:
    global _notify
    tempfile.tempdir = tmp  # what the work leaves in temporary files goes when the parent removes tmp
    os.environ["TMPDIR"] = tmp

    def notify(name: str, timed: bool) -> None:
        conn.send(("stage", name, timed))

    _notify = notify
    try:
        message: tuple = ("ok", fn())
    except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the parent
        message = ("raise", exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or full stream: nothing more to say there
            pass
    try:
        conn.send(message)
    except Exception as exc:  # noqa: BLE001 - a result or exception that does not pickle
        original = message[1]
        conn.send(("raise", RuntimeError(f"{type(original).__name__}: {original} (not picklable: {exc})")))
    conn.close()


def run_bounded(fn: Callable[[], T], *, limit: float | None, what: str, first_stage: str) -> T:
    """``fn()`` in a forked child process, each of its stages (see :func:`stage`, the first one
    being ``first_stage``) limited to ``limit`` seconds (None or 0: no limit, ``fn`` runs here).

    Returns what ``fn`` returns and raises what it raises (both must pickle). Raises
    :class:`StageTimeout` naming ``what`` and the stage when one takes longer: the child is stopped
    (SIGTERM, then SIGKILL) and its temporary files removed. When forking is not safe here
    (:func:`can_bound`), ``fn`` runs in this process without a limit.
    """
    if not limit or not can_bound():
        return fn()
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="nafix-")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, fn, tmp))  # not a daemon: it may start processes
    try:
        proc.start()
        sender.close()
        name, timed, since = first_stage, True, time.monotonic()
        while True:
            wait_for = max(0.0, since + limit - time.monotonic()) if timed else None
            ready = wait([receiver, proc.sentinel], timeout=wait_for)
            got_message = False
            while receiver.poll():
                try:
                    message = receiver.recv()
                except (EOFError, OSError):
                    break
                except Exception as exc:  # noqa: BLE001 - an exception that does not unpickle here
                    raise RuntimeError(f"the child process's answer could not be read ({exc})") from None
                got_message = True
                if message[0] == "stage":
                    name, timed, since = message[1], message[2], time.monotonic()
                    continue
                if message[0] == "ok":
                    return message[1]
                raise message[1]
            if got_message:
                continue
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(timeout=5)
                raise NafixError(
                    f"{what}: the process running nafix's work died during {name} (exit code {proc.exitcode}); "
                    "the model may be too large for this machine's memory."
                )
            if timed and time.monotonic() - since >= limit:
                raise StageTimeout(
                    f"{what}: {name} took longer than the time limit of {limit:g} s (--timeout) and was "
                    "stopped (--timeout 0: no limit)."
                )
    finally:
        receiver.close()
        if proc.is_alive():
            proc.terminate()  # SIGTERM first: a temporary output file is removed by its handler
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()  # stuck in native code: no Python handler runs there
        proc.join(timeout=5)
        shutil.rmtree(tmp, ignore_errors=True)
