"""Run the per-model audit over many files: cache lookups, then a pool of worker processes (or a
Dask cluster) for the rest, with a per-model timeout; rows come back sorted by path."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .. import __version__
from ..errors import InputError, UsageError
from .cache import Cache, cache_key, content_sha256, options_fingerprint, remembered_options_fingerprint
from .worker import error_row, worker_main

if TYPE_CHECKING:
    from ..results import AuditResult

log = logging.getLogger(__name__)

#: progress(done, total, failures)
Progress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            k, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise UsageError(f"--shard '{text}' is not K/N (e.g. 1/3).") from None
        if n < 1 or not 1 <= k <= n:
            raise UsageError(f"--shard '{text}': K must be between 1 and N (e.g. 1/3).")
        return cls(k, n)

    def takes(self, path: str) -> bool:
        """Deterministic by the path as given (POSIX form), so every machine splits a zoo alike."""
        h = int.from_bytes(hashlib.sha256(Path(path).as_posix().encode()).digest()[:8], "big")
        return h % self.count == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class ZooOptions:
    """How to run a many-model audit."""

    jobs: int = 0  # 0: the number of CPUs
    timeout: float | None = 120.0  # seconds per model; None: no limit
    cache_dir: Path | None = None  # None: the platform user cache folder
    use_cache: bool = True
    shard: Shard | None = None
    executor: str | None = None  # dask://HOST:PORT
    recursive: bool = True
    #: the calling process holds nafix's own modules only (the ``nafix`` command): on Linux its
    #: workers may then be forked from it, as long as no onnxruntime is loaded and no other thread
    #: runs (see ``_context``); a program that embeds nafix gets a fork server
    own_process: bool = False


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def audit_rows(paths: Sequence[str | os.PathLike[str]], analysis, zoo: ZooOptions = ZooOptions(), *,
               progress: Progress | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Audit every model under ``paths``; return (rows sorted by path, run statistics).

    The workers of a program that embeds nafix come from a fork server (see ``_context``), which
    imports the program's main module in each of them: guard its main code with
    ``if __name__ == "__main__":`` as for any multiprocessing program."""
    from ..options import collect_models, resolve_pools, resolve_profile  # light: a cache hit needs no analysis
    from .cache import default_cache_dir

    if not paths:
        raise UsageError("give at least one model file or folder to audit.")
    resolved: list = []

    def profile_and_pools():
        if not resolved:
            resolved.extend((resolve_profile(analysis), resolve_pools(analysis)))
        return resolved

    cache = Cache(zoo.cache_dir or default_cache_dir()) if zoo.use_cache else None
    # bad options fail here, once, before any worker starts; options that fingerprinted before (the
    # memo in the cache folder) are not read again: a run answered from the cache loads no profile
    opt_fp = (remembered_options_fingerprint(cache.root, analysis,
                                             lambda: options_fingerprint(analysis, *profile_and_pools()))
              if cache is not None else "")
    if cache is None:
        profile_and_pools()
    files = collect_models(paths, recursive=zoo.recursive)
    if not files:
        raise InputError(f"no .onnx or .tflite model found under {', '.join(str(p) for p in paths)}.")
    # every path given gets a row: a folder without any model is an error row of its own
    empty = [str(p) for p in paths if Path(p).is_dir() and not collect_models([p], recursive=zoo.recursive)]
    if zoo.shard is not None:
        files = [f for f in files if zoo.shard.takes(str(f))]
        empty = [p for p in empty if zoo.shard.takes(p)]
    names = sorted({str(f) for f in files})
    stats: dict[str, Any] = {"models": len(names), "cached": 0, "analysed": 0}
    rows: dict[str, dict[str, Any]] = {p: error_row(p, f"{p}: no .onnx model found in this folder.") for p in empty}
    if not names:
        return sorted(rows.values(), key=lambda r: r["path"]), stats
    todo: list[tuple[str, str | None, str | None]] = []  # (path, sha256, cache key)
    for name in names:
        if cache is None:  # the workers hash the files, in parallel
            todo.append((name, None, None))
            continue
        sha = content_sha256(Path(name))
        key = cache_key(sha, opt_fp) if sha is not None else None
        row = cache.get(key) if key is not None else None
        if row is not None:
            rows[name] = dict(row, path=name, sha256=sha)
        else:
            todo.append((name, sha, key))
    stats["cached"] = len(names) - len(todo)
    failures = len(empty)
    if progress:
        progress(stats["cached"], len(names), failures)

    def done(name: str, row: dict[str, Any]) -> None:
        nonlocal failures
        rows[name] = row
        if row.get("error"):
            failures += 1
        if progress:
            progress(len(rows) - len(empty), len(names), failures)

    cache_root = str(cache.root) if cache is not None else None
    if todo:
        # forked workers inherit the resolved profile and the modules the analysis uses: no worker
        # parses the profile YAML again or imports on its first model (a run answered from the cache
        # imports none of them)
        from .. import report_data  # noqa: F401
        from . import worker

        worker.prime(analysis, *profile_and_pools())
        if zoo.executor:
            from .dask_executor import run_dask

            run_dask(zoo.executor, todo, analysis, zoo.timeout, cache_root, done)
        else:
            jobs = zoo.jobs or default_jobs()
            _run_pool(todo, analysis, min(jobs, len(todo)), zoo.timeout, cache_root, done,
                      own_process=zoo.own_process)
    stats["analysed"] = len(todo)
    return sorted(rows.values(), key=lambda r: r["path"]), stats


#: what the fork server imports once, before it forks any worker: the modules every analysis needs,
#: and never onnxruntime (its threads and sessions must not exist in a process that forks)
_PRELOAD = ["fixer.zoo.worker", "fixer.api", "fixer.report_data", "fixer.npu.mpool", "fixer.shape_fill", "yaml"]


def _fork_is_safe(own_process: bool) -> bool:
    """Whether a worker may be forked from this very process.

    A forked child gets a copy of the parent's memory but only the thread that forked: a lock held
    by another thread stays locked for ever, and an object that owns threads is a trap. onnxruntime
    is one: a session alive in the parent (or garbage not yet collected) is copied into the child,
    and when the child's garbage collector frees it, its destructor joins the thread pool of the
    parent, threads that do not exist in the child: the worker waits for ever (the flaky per-model
    timeout of issue 32, in a test process where earlier tests had run onnxruntime). Python's
    ``threading.active_count()`` cannot see such native threads. So fork only where everything
    loaded is known: the nafix command's own process, with one Python thread and onnxruntime not
    even imported (nafix's other native threads are numpy's BLAS pool, which handles fork itself)."""
    return (own_process and sys.platform.startswith("linux") and threading.active_count() == 1
            and "onnxruntime" not in sys.modules)


def _context(own_process: bool = False):
    """fork where it is safe (see ``_fork_is_safe``: the workers start with nafix already
    imported), else forkserver (a clean server process, started without onnxruntime, imports nafix
    once and forks the workers), else spawn (Windows, and macOS where fork is unsafe)."""
    import multiprocessing as mp  # here: a run answered from the cache starts no process

    methods = mp.get_all_start_methods()
    if _fork_is_safe(own_process):
        return mp.get_context("fork")
    if "forkserver" in methods and sys.platform != "darwin":
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        with _cwd_that_exists():
            _start_fork_server()
        return ctx
    return mp.get_context("spawn")


def _start_fork_server() -> None:
    """Start the fork server (when not running yet) with SIGINT ignored: it imports nafix before it
    ignores SIGINT itself, and a Ctrl-C meanwhile would print its traceback; the workers it forks
    inherit the setting. This process keeps its own handler: SIGINT is held back meanwhile and
    delivered right after (Linux keeps a blocked signal pending even while it is ignored)."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()  # only the main thread may change a signal's handler
        return
    with _sigint_blocked():
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            forkserver.ensure_running()
        finally:
            if old is not None:  # None: a handler set outside Python, left alone
                signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def _cwd_that_exists():
    """A current folder that exists while a fork server or spawned worker starts: multiprocessing
    hands the parent's current folder to the new process, and ``os.getcwd()`` fails in a folder that
    was deleted (``nafix audit`` run from it). There the temporary folder stands in meanwhile (a
    relative path cannot be read from a deleted folder anyway), and this process returns to the one
    it was in."""
    try:
        os.getcwd()
    except FileNotFoundError:
        pass
    else:
        yield
        return
    here = os.open(".", os.O_RDONLY)
    try:
        os.chdir(tempfile.gettempdir())
        yield
    finally:
        os.fchdir(here)
        os.close(here)


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT held back while a worker starts: a forked worker inherits the blocked signal and
    ignores it from its first line on (one from the fork server inherits the server's SIG_IGN), so
    Ctrl-C reaches only this process; a Ctrl-C that came meanwhile is delivered here right after."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    old = mask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


class _Slot:
    """One worker process and the task it is running."""

    def __init__(self, ctx, analysis, cache_root):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, daemon=True,
                                args=(child, analysis, cache_root, ctx.get_start_method(), os.getpid()))
        try:
            with _sigint_blocked(), _cwd_that_exists():
                self.proc.start()
        except BaseException:  # a Ctrl-C delivered as the start ends: leave no worker behind
            if self.proc.pid is not None:
                with contextlib.suppress(Exception):
                    self.proc.kill()
                    self.proc.join(timeout=5)
            self.conn.close()
            raise
        finally:
            child.close()
        self.task: tuple[int, str, str | None, str | None] | None = None
        self.started = 0.0

    def give(self, index: int, item: tuple[str, str | None, str | None]) -> None:
        self.task = (index, *item)
        self.started = time.monotonic()
        self.conn.send((index, *item))

    def terminate(self) -> None:
        """Ask the worker to end now (SIGTERM: a worker ends at once, except while it writes a cache
        entry, which it finishes first so that no temporary file is left)."""
        if self.proc.pid is not None and self.proc.exitcode is None:
            with contextlib.suppress(OSError):
                self.proc.terminate()

    def stop(self, *, kill: bool = False, grace: float = 5.0) -> None:
        if kill:
            self.terminate()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        self.proc.join(timeout=grace)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.conn.close()


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _run_pool(todo, analysis, jobs: int, timeout: float | None, cache_root: str | None, done, *,
              own_process: bool = False) -> None:
    """A fixed pool of ``jobs`` worker processes, each loading one model at a time. A worker that
    dies (crash, out of memory) or exceeds ``timeout`` on a model is replaced; that model becomes an
    error row and the others go on."""
    from multiprocessing.connection import wait

    ctx = _context(own_process)
    # largest files first (a proxy for analysis time): the last model to finish is a small one
    queue = sorted(enumerate(todo), key=lambda it: _size(it[1][0]))
    slots: list[_Slot] = []
    finished = False
    try:
        for _ in range(jobs):
            slots.append(_Slot(ctx, analysis, cache_root))
        for s in slots:
            if queue:
                s.give(*queue.pop())
        while any(s.task for s in slots):
            busy = [s for s in slots if s.task]
            wait_for = None
            if timeout is not None:
                now = time.monotonic()
                wait_for = max(0.0, min(s.started + timeout - now for s in busy))
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=wait_for)
            now = time.monotonic()
            for i, s in enumerate(slots):
                if not s.task:
                    continue
                index, name, sha, key = s.task
                row = None
                if s.conn in ready:
                    try:
                        got_index, row = s.conn.recv()
                        if got_index != index:  # cannot happen with one task per worker
                            row = error_row(name, f"{name}: internal error: a worker answered for another model.", sha)
                    except (EOFError, OSError):
                        row = None
                if row is not None:
                    s.task = None
                    done(name, row)
                elif s.proc.sentinel in ready or not s.proc.is_alive():
                    code = s.proc.exitcode
                    done(name, error_row(name, f"{name}: the worker process analysing this model died "
                                               f"(exit code {code}); the model may be too large for this machine's memory.", sha))
                    s.stop(kill=True)
                    slots[i] = s = _Slot(ctx, analysis, cache_root)
                elif timeout is not None and now - s.started >= timeout:
                    done(name, error_row(name, f"{name}: the analysis took longer than the per-model "
                                               f"timeout of {timeout:g} s (--timeout).", sha))
                    s.stop(kill=True)
                    slots[i] = s = _Slot(ctx, analysis, cache_root)
                if s.task is None and queue:
                    s.give(*queue.pop())
        finished = True
    finally:
        if finished:
            for s in slots:
                s.stop(kill=bool(s.task))
        else:  # Ctrl-C, SIGTERM or an error here: end every worker now, all at once
            _cancel(slots)


def _cancel(slots: list[_Slot]) -> None:
    """End every worker: SIGTERM to all, a short grace for one finishing its cache write, then
    SIGKILL. Runs while a KeyboardInterrupt is propagating: a second Ctrl-C must not cut it short
    (the workers ignore SIGINT; they would otherwise be left to the parent-death signal)."""
    with _sigint_blocked():
        for s in slots:
            s.terminate()
        deadline = time.monotonic() + 2.0
        for s in slots:
            s.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join(timeout=5)
            s.conn.close()


def build_report(rows: list[dict[str, Any]], *, profile: str, shard: Shard | None = None,
                 nafix_version: str = __version__) -> dict[str, Any]:
    """The JSON report of an audit: header, rows (sorted by path) and the zoo summary."""
    from ..report_data import ESTIMATE_NOTE
    from .summary import zoo_summary

    rows = sorted(rows, key=lambda r: r["path"])
    report: dict[str, Any] = {
        "nafix_version": nafix_version,
        "profile": profile,
        "estimated": True,
        "note": ESTIMATE_NOTE,
        "models": rows,
        "summary": zoo_summary(rows),
    }
    if shard is not None:
        report["shard"] = {"index": shard.index, "count": shard.count}
    from ..selection import summary as selection_summary

    selected = selection_summary(rows)  # what --select-finding/--ignore-finding set aside (audit, merge)
    if selected is not None:
        report["selection"] = selected
    return report


def audit_dict(result: AuditResult, *, profile: str) -> dict[str, Any]:
    """The JSON report of an in-process ``fixer.api.audit`` result (same shape as ``nafix audit``)."""
    from ..report_data import audit_row

    return build_report([audit_row(m) for m in result.models], profile=profile)
