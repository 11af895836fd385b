"""The per-model function every executor runs (in-process, a worker process, or a Dask worker)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: profile and memory pools resolved once per worker process and options
_resolved: dict[str, tuple[Any, Any]] = {}


def _profile_and_pools(opts):
    from ..api import resolve_pools, resolve_profile

    key = repr(opts)
    if key not in _resolved:
        _resolved.clear()
        _resolved[key] = (resolve_profile(opts), resolve_pools(opts))
    return _resolved[key]


def prime(opts, profile, pools) -> None:
    """Remember the profile and pools already resolved for ``opts`` (workers forked after this
    inherit them)."""
    _resolved.clear()
    _resolved[repr(opts)] = (profile, pools)


def error_row(path: str, message: str, sha256: str | None = None) -> dict[str, Any]:
    """:func:`fixer.report_data.error_row` (kept here, where callers found it)."""
    from ..report_data import error_row as row

    return row(path, message, sha256)


def audit_one(path: str, opts, sha256: str | None = None) -> dict[str, Any]:
    """Audit one model file and return its report row (:func:`fixer.api.audit_model`, the one audit of
    a model); every failure becomes an error row."""
    from ..api import audit_error, audit_model
    from ..report_data import audit_row

    if sha256 is None:
        from .cache import content_sha256

        sha256 = content_sha256(Path(path))
    try:
        profile, pools = _profile_and_pools(opts)
    except Exception as exc:  # noqa: BLE001 - one broken model must not abort a zoo audit
        return error_row(path, audit_error(path, exc), sha256)
    return audit_row(audit_model(path, opts, profile=profile, pools=pools), path=path, sha256=sha256)


def audit_and_store(path: str, opts, sha256: str | None, key: str | None, cache_root: str | None) -> dict[str, Any]:
    """``audit_one``, then store a successful row in the cache (in the worker: the writes run in
    parallel too)."""
    row = audit_one(path, opts, sha256)
    if key is not None and cache_root is not None:
        from .cache import Cache

        with _sigterm_deferred():  # the entry is written whole (no temporary file left) before SIGTERM ends the worker
            Cache(Path(cache_root)).put(key, row)
    return row


@contextlib.contextmanager
def _sigterm_deferred():
    """In a worker process of ``worker_main``: a SIGTERM that comes meanwhile ends the worker right
    after (the worker's SIGTERM otherwise ends it at once, wherever it is). The handler is the
    process's, whichever of its threads the signal lands on (onnxruntime and BLAS threads may
    exist): blocking the signal in this thread alone would not do. Elsewhere (in-process, a Dask
    worker, a thread other than the main one) a no-op."""
    if not _in_worker or threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
        if pending:
            os.kill(os.getpid(), signal.SIGTERM)


_in_worker = False

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send ``sig`` to this process when its parent ends (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError, TypeError):
        return False


def _parent_gone(watch_pid: int | None, sentinel) -> bool:
    """The parent that started this worker has ended: for a forked worker, its parent process
    ``watch_pid`` is no longer its parent; otherwise the pipe that only the parent holds open
    (``sentinel``) has reached its end."""
    if watch_pid is not None and os.getppid() != watch_pid:
        return True
    if sentinel is not None:
        from multiprocessing.connection import wait

        try:
            return bool(wait([sentinel], timeout=0))
        except (OSError, ValueError):
            return False
    return False


def _parent_sentinel():
    """A file descriptor that reaches its end when the process that started this worker ends (the
    end of a pipe only that process holds open)."""
    import multiprocessing as mp

    parent = mp.parent_process()
    return parent.sentinel if parent is not None else None


def _release_fork_server() -> bool:
    """In a worker from the fork server: close its copy of the server's "alive" pipe. The server
    ends when every copy is closed; with the copies the workers get, a server whose client died
    (SIGKILL) would wait for its workers, and they for it. Then the server ends with the pool's
    process, and its workers with it (parent-death signal). False when that could not be done."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return False
    try:
        os.close(fd)
    except OSError:
        return False
    server._forkserver_alive_fd = None
    return True


def _watch_parent(watch_pid: int | None, sentinel, ppid: int) -> None:
    """Thread body (where the parent-death signal is not available): end this process as soon as
    its parent is gone, even while the main thread is busy in native code."""
    from multiprocessing.connection import wait

    while True:
        if sentinel is not None:
            with contextlib.suppress(OSError, ValueError):
                wait([sentinel], timeout=1.0)
        else:
            time.sleep(1.0)
        if _parent_gone(watch_pid, sentinel) or os.getppid() != ppid:
            os._exit(1)


def _become_worker(start_method: str | None, parent_pid: int | None) -> None:
    """First lines of a worker process: Ctrl-C is the parent's to handle (it cancels the pool), so
    the worker ignores SIGINT; SIGTERM ends it at once (the parent's cleanup handler, inherited by a
    fork, only applies to the parent's own files); and the worker dies with its parent (SIGKILL
    from the OOM killer, ``timeout -s KILL`` or a CI cancel included): on Linux by the kernel's
    parent-death signal (for a worker from the fork server: when the server ends, which it does
    when the pool's process ends), set here and then checked against a parent that ended before
    it was set; elsewhere by a watchdog thread."""
    global _in_worker

    _in_worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):  # started with SIGINT held back (see runner._sigint_blocked)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    watch_pid = parent_pid if start_method == "fork" else None
    sentinel = _parent_sentinel()
    ppid = os.getppid()
    armed = _parent_death_signal(signal.SIGKILL)
    if start_method == "forkserver" and not _release_fork_server():
        armed = False  # the server may outlive the pool's process: watch that process itself
    if _parent_gone(watch_pid, sentinel):
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(watch_pid, sentinel, ppid), name="nafix-parent-watch",
                         daemon=True).start()


def worker_main(conn, opts, cache_root: str | None = None, start_method: str | None = None,
                parent_pid: int | None = None) -> None:
    """Loop of a worker process: receive (index, path, sha256, cache key), send (index, row); None
    stops it. ``start_method`` and ``parent_pid``: how the pool's process (``parent_pid``) started it."""
    _become_worker(start_method, parent_pid)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        index, path, sha, key = task
        row = audit_and_store(path, opts, sha, key, cache_root)
        try:
            conn.send((index, row))
        except (BrokenPipeError, OSError):
            return
