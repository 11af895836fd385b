"""Runs the TFLite interpreter in a child process for the import check (and says which one).

The interpreter is native code that can crash (segmentation fault) on a corrupt or inconsistent
model that still parses; in a child process such a crash is an error row, not the end of nafix.

    python fixer/importers/_tflite_worker.py FOLDER

It imports only numpy and the interpreter (no nafix module), so the child starts fast.

FOLDER holds ``model.tflite``, ``request.json`` (``{"samples": N, "tensors": [indices],
"preserve": bool}``) and ``inputs.npz`` (``s{sample}_{input}`` arrays in the subgraph's input order).
The worker writes ``outputs.npz`` (``s{sample}_o{output}`` and ``s{sample}_t{tensor}``) and
``done.json`` (which runtime ran, or the error it raised).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (native code's prints) for the duration of the block."""
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no stderr to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def interpreter_class():
    """The TFLite Interpreter class of the first installed runtime, or None."""
    try:
        from ai_edge_litert.interpreter import Interpreter
        return Interpreter
    except ImportError:
        pass
    try:
        from tflite_runtime.interpreter import Interpreter  # type: ignore[import-not-found]
        return Interpreter
    except ImportError:
        pass
    try:  # pragma: no cover - TensorFlow is never a dependency
        import tensorflow as tf  # type: ignore[import-not-found]
        return tf.lite.Interpreter
    except ImportError:
        return None


def make_interpreter(Interp, data: bytes, *, preserve: bool):
    """The interpreter as users run it (default resolver, XNNPACK delegate for CPU); when the delegate
    refuses the model (XNNPACK rejects e.g. an int8 CONCATENATION whose inputs differ in scale), TFLite's
    own kernels without delegates."""
    kwargs = {"experimental_preserve_all_tensors": True} if preserve else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runtime warns that keeping every tensor costs memory
        with _quiet_stderr():  # the runtime prints an INFO line about its CPU delegate
            try:
                interp = Interp(model_content=bytes(data), **kwargs)
                interp.allocate_tensors()
                return interp
            except (ValueError, RuntimeError):
                resolver = getattr(sys.modules.get(Interp.__module__), "OpResolverType", None)
                if resolver is None:
                    raise
            interp = Interp(model_content=bytes(data), **kwargs,
                            experimental_op_resolver_type=resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
            interp.allocate_tensors()
            return interp



def main(folder: str) -> int:
    d = Path(folder)
    req = json.loads((d / "request.json").read_text())
    Interp = interpreter_class()
    if Interp is None:
        (d / "done.json").write_text(json.dumps({"error": "no TFLite interpreter installed"}))
        return 0
    try:
        interp = make_interpreter(Interp, (d / "model.tflite").read_bytes(), preserve=bool(req["preserve"]))
        feeds = np.load(d / "inputs.npz")
        out: dict[str, np.ndarray] = {}
        ins = interp.get_input_details()
        outs = interp.get_output_details()
        for s in range(int(req["samples"])):
            for i, det in enumerate(ins):
                interp.set_tensor(det["index"], feeds[f"s{s}_{i}"])
            interp.invoke()
            for k, det in enumerate(outs):
                out[f"s{s}_o{k}"] = interp.get_tensor(det["index"])
            for t in req["tensors"]:
                out[f"s{s}_t{t}"] = interp.get_tensor(int(t))
        np.savez(d / "outputs.npz", **out)
        (d / "done.json").write_text(json.dumps({"runtime": Interp.__module__.split(".")[0]}))
    except Exception as exc:  # noqa: BLE001 - every runtime error goes back to the parent as text
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        (d / "done.json").write_text(json.dumps({"error": first}))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main(sys.argv[1]))
