"""``--executor dask://HOST:PORT``: the same per-model function on an existing Dask cluster
(optional extra ``nafix[dask]``). The workers need nafix installed and the model paths readable
(a shared file system); the cache folder, when used, should be shared too.

Each model has the per-model ``--timeout`` the local process pool gives it: on the worker, the model
is analysed in a child process (``python -m fixer.zoo.dask_executor``; a Dask worker process may not
start multiprocessing children) that is killed when the time is up, and the model becomes an error
row with the pool's sentence; the worker goes on with the next model. Native code that never returns
(a runaway onnxruntime loop) is stopped that way too. Without a timeout the model is analysed in the
worker's own thread."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any, Callable

from ..errors import ToolError, UsageError
from .worker import audit_and_store, error_row


def run_dask(address: str, todo, analysis, timeout: float | None, cache_root: str | None,
             done: Callable[[str, dict[str, Any]], None]) -> None:
    if not address.startswith("dask://") or len(address) <= len("dask://"):
        raise UsageError(f"--executor '{address}' is not dask://HOST:PORT.")
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise UsageError("--executor dask://... needs Dask's distributed package: pip install 'nafix[dask]'.") from None
    target = "tcp://" + address[len("dask://"):]
    try:
        client = Client(target, timeout=30)
    except (OSError, TimeoutError) as exc:
        raise ToolError(f"cannot reach the Dask scheduler at {target} ({exc}).") from None
    try:
        futures = {}
        for name, sha, key in todo:
            fut = client.submit(bounded_audit, name, analysis, sha, key, cache_root, timeout, pure=False)
            futures[fut] = (name, sha)
        try:  # a backstop for a lost cluster: each model is bounded on its worker (bounded_audit)
            for fut in as_completed(list(futures), timeout=None if timeout is None else timeout * max(1, len(todo)) + 60):
                name, sha = futures[fut]
                try:
                    done(name, fut.result())
                except Exception as exc:  # noqa: BLE001 - a lost worker: one error row
                    done(name, error_row(name, f"{name}: the Dask task failed ({type(exc).__name__}: {exc}).", sha))
        except TimeoutError:
            for fut, (name, sha) in futures.items():
                if not fut.done():
                    fut.cancel()
                    done(name, error_row(name, f"{name}: the Dask cluster did not return a result in time "
                                               f"(--timeout {timeout:g} s per model).", sha))
    finally:
        client.close()


def bounded_audit(name: str, analysis, sha: str | None, key: str | None, cache_root: str | None,
                  timeout: float | None) -> dict[str, Any]:
    """The Dask task: ``audit_and_store`` of one model, in a child process stopped after ``timeout``
    seconds (see the module docstring)."""
    if timeout is None:
        return audit_and_store(name, analysis, sha, key, cache_root)
    payload = pickle.dumps((name, analysis, sha, key, cache_root))
    try:
        done = subprocess.run([sys.executable, "-m", "fixer.zoo.dask_executor"], input=payload, capture_output=True,
                              timeout=timeout, env=dict(os.environ, PYTHONPATH=_path()))
    except subprocess.TimeoutExpired:  # subprocess.run has killed the child
        return error_row(name, f"{name}: the analysis took longer than the per-model timeout of {timeout:g} s "
                               "(--timeout).", sha)
    if done.returncode == 0 and done.stdout:
        try:
            return pickle.loads(done.stdout)  # noqa: S301 - our own child's answer
        except Exception:  # noqa: BLE001 - a truncated answer: the error row below
            pass
    return error_row(name, f"{name}: the process analysing this model on the Dask worker died (exit code "
                           f"{done.returncode}); the model may be too large for the worker's memory.", sha)


def _path() -> str:
    """PYTHONPATH for the child: the worker's import path, so it imports the same nafix."""
    return os.pathsep.join(p for p in sys.path if p)


def _child_main() -> None:
    """``python -m fixer.zoo.dask_executor``: one model's row from the pickled arguments on stdin,
    pickled on stdout (the library's own prints go to stderr)."""
    args = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - from bounded_audit
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the analysis prints must not corrupt the answer
    row = audit_and_store(*args)
    answer.write(pickle.dumps(row))
    answer.close()


if __name__ == "__main__":
    _child_main()
