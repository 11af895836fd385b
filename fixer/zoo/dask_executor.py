"""``--executor dask://HOST:PORT``: the same per-model function on an existing Dask cluster
(optional extra ``nafix[dask]``). The workers need nafix installed and the model paths readable
(a shared file system); the cache folder, when used, should be shared too."""

from __future__ import annotations

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
            fut = client.submit(audit_and_store, name, analysis, sha, key, cache_root, pure=False)
            futures[fut] = (name, sha)
        try:
            for fut in as_completed(list(futures), timeout=None if timeout is None else timeout * max(1, len(todo))):
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
