#!/usr/bin/env python3
"""Compare TFLite -> ONNX converters on a folder of .tflite files (the figures in docs/TFLITE.md).

    python scripts/compare_tflite_importers.py {nafix|tflite2onnx|tf2onnx} [FOLDER]

Run it with the Python of a venv that has the converter (tflite2onnx, or tf2onnx + tensorflow-cpu)
and a TFLite interpreter (ai-edge-litert, or TensorFlow's). For each model it prints: converted or
the converter's error, the conversion time, the ONNX node and Q/DQ counts, and the largest difference
of each output against the interpreter on one seeded input, relative to the output's largest
magnitude. Outputs are paired by element count, so two outputs of the same size may be paired wrongly
(the importer's own check in fixer.importers.tflite_check pairs them by name).
FOLDER defaults to ../shared/reference/pairs (searched recursively).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def convert(which: str, src: Path, dst: Path) -> None:
    if which == "nafix":
        import onnx

        sys.path.insert(0, str(ROOT))
        from fixer.importers.tflite import read_tflite

        onnx.save(read_tflite(src).model, str(dst))
    elif which == "tflite2onnx":
        import tflite2onnx

        tflite2onnx.convert(str(src), str(dst))
    elif which == "tf2onnx":
        r = subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--tflite", str(src), "--output", str(dst),
                            "--opset", "13"], capture_output=True, text=True, timeout=900)
        if r.returncode:
            raise RuntimeError((r.stderr.strip().splitlines() or ["tf2onnx failed"])[-1])
    else:
        raise SystemExit(f"unknown converter {which!r}")


def interpreter():
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        import tensorflow as tf

        Interpreter = tf.lite.Interpreter
    return Interpreter


def compare(src: Path, dst: Path) -> str:
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(dst))
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    it = interpreter()(model_path=str(src))
    it.allocate_tensors()
    rng = np.random.default_rng(0)
    feed = {}
    for d, i in zip(it.get_input_details(), sess.get_inputs()):
        dt = d["dtype"]
        x = rng.uniform(-1, 1, d["shape"]).astype(np.float32) if dt == np.float32 else \
            rng.integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, d["shape"]).astype(dt)
        it.set_tensor(d["index"], x)
        xi = x.transpose(0, 3, 1, 2) if x.ndim == 4 and list(i.shape[1:]) != list(x.shape[1:]) else x
        feed[i.name] = xi
    it.invoke()
    got = sess.run(None, feed)
    errs = []
    for d in it.get_output_details():
        r = it.get_tensor(d["index"])
        cand = [g for g in got if g.size == r.size]
        if not cand:
            errs.append("no output of that size")
            continue
        g = cand[0] if cand[0].shape == r.shape else np.moveaxis(cand[0], 1, -1).reshape(r.shape)
        errs.append(f"{float(np.abs(r.astype(np.float64) - g).max()) / (float(np.abs(r).max()) or 1.0):.3g}")
    qdq = sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in m.graph.node)
    return f"nodes={len(m.graph.node)} qdq={qdq} max_rel_err=[{', '.join(errs)}]"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    which = argv[0]
    folder = Path(argv[1]) if len(argv) > 1 else ROOT.parent / "shared" / "reference" / "pairs"
    files = sorted(folder.rglob("*.tflite"))
    converted = 0
    for f in files:
        with tempfile.TemporaryDirectory() as tmp:
            dst = Path(tmp) / "m.onnx"
            t0 = time.perf_counter()
            try:
                convert(which, f, dst)
            except Exception as exc:  # noqa: BLE001 - report any converter failure as a row
                print(f"{f.name} | FAIL | {time.perf_counter() - t0:.2f} s | {str(exc).splitlines()[0][:150]}")
                continue
            dt = time.perf_counter() - t0
            converted += 1
            try:
                print(f"{f.name} | ok | {dt:.2f} s | {compare(f, dst)}")
            except Exception as exc:  # noqa: BLE001
                print(f"{f.name} | RUNFAIL | {dt:.2f} s | {str(exc).splitlines()[0][:150]}")
    print(f"{which}: {converted}/{len(files)} converted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
