"""Speed-at-scale figures for ``scripts/bench.py --speed`` (issue 13), printed side by side.

Each section prints nafix's figure next to its reference, measured in the same run (medians), and
the ratio the target is stated in. Figures that need a clean process (peak memory) run in a child
process. Nothing here asserts: machines are noisy; read the ratios.

Sections (``--speed all`` or a comma list): ``audit`` (one-process audit vs onnx.load +
infer_shapes of the same models; peak memory of the folder audit vs the largest single-model audit),
``chains`` (fix --dry-run of synthetic QDQ conv chains of growing size, then the two largest
chains' main-thread time stage by stage: what grows faster than the node count), ``quantize``
(``--quantize`` on gtcrn and on a ~15k-node synthetic graph; quantizing a float YOLOv8n-like model vs
plain ``quantize_static``), ``onnxslim`` (``nafix MODEL`` vs onnxslim per model; skipped when
onnxslim is not installed).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "models"
med = statistics.median


def _load() -> str:
    if hasattr(os, "getloadavg"):
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    return "?"


@functools.cache
def _compile_nafix() -> None:
    """Compile nafix's modules to bytecode once, as an installed package's are (pip compiles them at
    install; an editable install writes them at the first import). The child processes import nafix
    from this checkout, and where ``PYTHONDONTWRITEBYTECODE`` is set (this machine sets it) each
    would otherwise compile its ~25k lines again: ~0.1-0.15 s per process that no user pays, against
    onnxruntime's own modules, which come compiled."""
    import compileall

    compileall.compile_dir(str(ROOT / "fixer"), quiet=1)


def _child(code: str, *args: str) -> dict:
    """Run ``code`` in a fresh interpreter (nafix importable, its bytecode compiled: :func:`_compile_nafix`);
    it prints one JSON line; add its peak RSS (MiB) and CPU seconds."""
    _compile_nafix()
    wrapper = ("import json, resource, sys, time\nsys.path.insert(0, %r)\nt0 = time.perf_counter()\n%s\n"
               "ru = resource.getrusage(resource.RUSAGE_SELF)\n"
               "out = dict(globals().get('OUT', {}))\n"
               # VmHWM: this process's peak (ru_maxrss keeps the parent's peak across fork + exec)
               "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
               "rss = int(hwm[0].split()[1]) / 1024 if hwm else ru.ru_maxrss / 1024\n"
               "out.update(rss_mib=rss, cpu_s=ru.ru_utime + ru.ru_stime, "
               "wall_s=time.perf_counter() - t0)\nprint(json.dumps(out))\n") % (str(ROOT), code)
    res = subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"child failed: {res.stderr.strip().splitlines()[-1:] or res.returncode}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# synthetic models
# ------------------------------------------------------------------------------------------------


def float_chain(blocks: int, c: int = 8, hw: int = 8, sub_every: int = 8, seed: int = 0) -> onnx.ModelProto:
    """input -> blocks x (Conv 1x1 c->c + bias -> Relu), with Sub(constant, x) after every
    ``sub_every``-th Conv (NAF006 rewrites it in the QDQ model: one change per ``sub_every`` blocks);
    built by the tests' builder, shapes inferred."""
    from tests.builders.qdq import float_sub_chain

    m = float_sub_chain(blocks, c=c, hw=hw, sub_every=sub_every, seed=seed)
    m.ir_version = 9
    return onnx.shape_inference.infer_shapes(m)


def qdq_chain(blocks: int) -> onnx.ModelProto:
    """:func:`float_chain` quantized by nafix (onnxruntime's QDQ quantizer): ~5.5 nodes per block."""
    from fixer.quantize import CalibrationOptions, quantize_float_model

    return quantize_float_model(float_chain(blocks), calib=CalibrationOptions(seed=0, max_samples=4)).model


def dequantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float model from a QDQ one: constant DequantizeLinear inputs become float initializers, and
    activation QuantizeLinear -> DequantizeLinear pairs are dropped (the float YOLOv8n the int8 export
    came from, up to rounding of its weights)."""
    inits = {t.name: t for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    alias: dict[str, str] = {}
    new_inits: dict[str, onnx.TensorProto] = {}
    keep = []

    def arr(name):
        return numpy_helper.to_array(inits[name])

    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            q = arr(n.input[0]).astype(np.float64)
            s = arr(n.input[1]).astype(np.float64)
            z = arr(n.input[2]).astype(np.float64) if len(n.input) > 2 and n.input[2] else np.zeros_like(s)
            if s.size > 1:
                axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % q.ndim
                shape = [1] * q.ndim
                shape[axis] = -1
                s, z = s.reshape(shape), z.reshape(shape)
            new_inits[n.output[0]] = numpy_helper.from_array(((q - z) * s).astype(np.float32), n.output[0])
        elif n.op_type == "DequantizeLinear" and producer.get(n.input[0]) is not None \
                and producer[n.input[0]].op_type == "QuantizeLinear":
            alias[n.output[0]] = producer[n.input[0]].input[0]
        elif n.op_type == "QuantizeLinear":
            continue
        else:
            keep.append(n)

    def resolve(name):
        while name in alias:
            name = alias[name]
        return name

    for n in keep:
        for i, name in enumerate(n.input):
            n.input[i] = resolve(name)
    for o in model.graph.output:  # an output behind Q/DQ: its float source takes the output's name
        src = resolve(o.name)
        if src != o.name:
            for n in keep:
                for field in (n.input, n.output):
                    for i, name in enumerate(field):
                        if name == src:
                            field[i] = o.name
    used = {i for n in keep for i in n.input}
    kept = [t for name, t in inits.items() if name in used and t.data_type != TensorProto.INT8
            and t.data_type != TensorProto.UINT8]
    g = helper.make_graph(keep, model.graph.name or "float", list(model.graph.input),
                          [helper.make_tensor_value_info(o.name, TensorProto.FLOAT, None) for o in model.graph.output],
                          kept + [t for name, t in new_inits.items() if name in used])
    m = helper.make_model(g, opset_imports=list(model.opset_import))
    m.ir_version = model.ir_version
    return onnx.shape_inference.infer_shapes(m)


# ------------------------------------------------------------------------------------------------
# sections
# ------------------------------------------------------------------------------------------------


def bench_audit(folder: Path, repeat: int) -> None:
    """One-process audit vs the load + infer_shapes floor (interleaved runs); peak memory of the
    folder audit vs the largest single-model audit (child processes)."""
    from fixer.api import AuditOptions, audit

    models = sorted(folder.glob("*.onnx"))

    def floor():
        for p in models:
            onnx.shape_inference.infer_shapes(onnx.load(str(p)))

    a_t, f_t = [], []
    # at least 9 interleaved rounds: each side takes well under a second, and 3 medians of such short
    # runs moved the ratio by 0.4x between runs on a loaded 2-core machine
    rounds = max(9, repeat)
    for _ in range(rounds):
        t0 = time.perf_counter()
        audit([folder], AuditOptions())
        a_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        floor()
        f_t.append(time.perf_counter() - t0)
    print(f"audit of {len(models)} models in one process: {med(a_t):.2f} s; onnx.load + infer_shapes floor "
          f"{med(f_t):.2f} s; ratio {med(a_t) / med(f_t):.2f}x (target <= 2.5x; medians of {rounds} interleaved "
          f"rounds)")
    _audit_stages(folder, repeat)
    code = ("from fixer.api import audit, AuditOptions\naudit([sys.argv[1]], AuditOptions())")
    whole = _child(code, str(folder))
    singles = {p.name: _child(code, str(p))["rss_mib"] for p in models}
    base = _child("import fixer.api")["rss_mib"]
    big = max(singles, key=singles.get)
    print(f"  peak RSS: folder audit {whole['rss_mib']:.0f} MiB; largest single-model audit "
          f"{singles[big]:.0f} MiB ({big}); difference {whole['rss_mib'] - singles[big]:+.0f} MiB "
          f"(target <= +50 MiB); interpreter + nafix imports alone {base:.0f} MiB")


#: Where an audit spends its time: (module, attribute, label), timed by plain wrappers (cProfile
#: would inflate the Python-heavy stages). A stage missing from the code is skipped.
AUDIT_STAGES = (
    ("fixer.model_io", "read_model_bytes", "read file"),
    ("fixer.model_io", "text_fields_are_utf8", "UTF-8 of text fields"),
    ("fixer.model_io", "_check_strings", "UTF-8 field walk"),
    ("fixer.model_io", "_NodeScan", "node walk (load checks)"),
    ("fixer.model_io", "_load_external_data", "external data"),
    ("fixer.model_io", "_check_acyclic", "cycle check"),
    ("fixer.model_io", "_check_references", "reference check"),
    ("onnx.checker", "check_model", "onnx checker"),
    ("fixer.shapes", "infer_shapes", "onnx shape inference"),
    ("fixer.shapes", "fill_shapes_by_running", "unknown shapes (shape_fill, else onnxruntime)"),
    ("fixer.api", "load_model", "= load total"),
    ("fixer.analysis", "GraphView", "graph import"),
    ("fixer.analysis", "quant_domain", "quantization domain"),
    ("fixer.analysis", "place", "placement"),
    ("fixer.analysis", "estimate_epochs", "epoch estimate"),
    ("fixer.analysis", "estimate_memory", "memory estimate"),
    ("fixer.api", "analyze_model", "= analysis total"),
    ("fixer.results", "ModelAnalysis.released", "release"),
)

#: Where a fix spends its main thread's time (the chains' stage table; the segment threads make
#: onnxruntime sessions beside it, and what the main thread waits for them shows in its stage).
#: Functions are also timed where another nafix module imported them by name.
FIX_STAGES = (
    ("fixer.shapes", "infer_shapes", "onnx shape inference"),
    ("fixer.model_io", "load_model", "= load"),
    ("fixer.graph", "GraphView.__init__", "graph import"),
    ("fixer.npu.placement", "place", "placement"),
    ("fixer.api", "analyze_model", "= analysis before and after"),
    ("fixer.engine", "Engine._commit", "engine commit (export, shapes, import, placement)"),
    ("fixer.engine", "run_engine", "= engine"),
    ("fixer.segments", "plan", "segment plans"),
    ("fixer.segments", "_Parts.__init__", "segment parts"),
    ("fixer.segments", "SegmentedSession.__init__", "segment models"),
    ("fixer.gate.parts", "proven_equal", "local proofs"),
    ("fixer.gate.parts", "rewritten_part", "rewritten parts"),
    ("fixer.gate.check", "verify", "= gate"),
)


def _stage_times(stages, run: Callable[[], object], repeat: int) -> dict[str, float]:
    """Seconds per stage label (medians over ``repeat`` calls of ``run``) of the main thread, each
    stage timed by a plain wrapper around its function (a stage that calls itself is counted once;
    a stage missing from the code is left out). The wrappers are removed afterwards."""
    import importlib
    import inspect
    import threading

    main = threading.main_thread()
    spent: dict[str, float] = {}
    patched = []
    for mod_name, attr, label in stages:
        owner = importlib.import_module(mod_name)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is None or not hasattr(owner, name):
            continue
        orig = getattr(owner, name)

        def timed(*a, _orig=orig, _label=label, _depth=[0], **k):
            if threading.current_thread() is not main:
                return _orig(*a, **k)
            _depth[0] += 1
            t0 = time.perf_counter()
            try:
                return _orig(*a, **k)
            finally:
                _depth[0] -= 1
                if _depth[0] == 0:
                    spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - t0

        targets = [owner]
        if not path and inspect.isfunction(orig):  # also where other nafix modules imported it by name
            targets += [m for n, m in list(sys.modules.items())
                        if m is not owner and n.split(".")[0] == "fixer" and getattr(m, name, None) is orig]
        for target in targets:
            setattr(target, name, timed)
            patched.append((target, name, orig))
    runs = []
    try:
        for _ in range(repeat):
            spent.clear()
            run()
            runs.append(dict(spent))
    finally:
        for target, name, orig in reversed(patched):
            setattr(target, name, orig)
    return {label: med(r.get(label, 0.0) for r in runs)
            for _, _, label in stages if any(label in r for r in runs)}


def _audit_stages(folder: Path, repeat: int) -> None:
    """Per-stage seconds of the one-process audit (medians over ``repeat`` audits), printed as one
    indented line."""
    from fixer.api import AuditOptions, audit

    times = _stage_times(AUDIT_STAGES, lambda: audit([folder], AuditOptions()), repeat)
    print("  audit stages (s): " + "; ".join(f"{label} {t:.3f}" for label, t in times.items()))


def bench_chains(repeat: int, sizes=(9, 36, 143, 571, 5710)) -> None:
    """fix --dry-run (engine + gate) on synthetic QDQ conv chains; time ratio against node ratio."""
    from fixer.api import FixOptions, fix

    rows = []
    with tempfile.TemporaryDirectory(prefix="nafix-bench-") as tmp:
        for blocks in sizes:
            path = Path(tmp) / f"chain_{blocks}.onnx"
            m = qdq_chain(blocks)
            onnx.save(m, path)
            n = len(m.graph.node)
            del m
            t = []
            for _ in range(repeat):  # the large chain too: one timing of it moved the ratio by 2.4x between runs
                gc.collect()  # not the previous model's garbage: this fix's own cost
                t0 = time.perf_counter()
                fix(path, FixOptions(dry_run=True))
                t.append(time.perf_counter() - t0)
            rows.append((n, med(t), path))
            print(f"  chain {n:6d} nodes: fix --dry-run {med(t):.2f} s (min {min(t):.2f}, max {max(t):.2f})",
                  flush=True)
        (n0, t0, p0), (n1, t1, p1) = rows[-2], rows[-1]
        print(f"fix of QDQ chains: {n0} -> {n1} nodes ({n1 / n0:.1f}x) costs {t1 / t0:.1f}x the time "
              f"(target <= 12x for ~10x nodes)")
        print(f"  control: one pure-Python pass over each chain's tensor names (a dict of producers, a lookup per "
              f"input, a set of every name) costs {_name_table_control(p0, p1, repeat):.1f}x on the large chain "
              f"on this machine now: what per-node Python work pays for {n1 / n0:.1f}x nodes at these sizes")
        fix_code = "from fixer.api import FixOptions, fix\nfix(sys.argv[1], FixOptions(dry_run=True))"
        peak = {n: _child(fix_code, str(p))["rss_mib"] for n, p in ((n0, p0), (n1, p1))}
        print(f"  peak RSS of one fix --dry-run in a fresh process: {peak[n0]:.0f} MiB ({n0} nodes), "
              f"{peak[n1]:.0f} MiB ({n1} nodes)")
        _chain_stages((n0, p0), (n1, p1), repeat)


def _name_table_control(small: Path, large: Path, repeat: int) -> float:
    """The time ratio, large chain over small, of one pure-Python pass over each chain's tensor names
    (a dict of each tensor's producer, a lookup of every node input, a set of every name: what each
    per-node stage of a fix does, without nafix's code), the collector paused as a fix pauses it;
    medians of at least 9 interleaved passes. Linear work would cost the node ratio; what it costs beyond that
    is the machine (the tables outgrow the CPU caches), and bounds what a fix's Python stages can do."""

    def names(path: Path) -> tuple[list[list[str]], list[list[str]]]:
        nodes = onnx.load(str(path)).graph.node
        return [n.input[:] for n in nodes], [n.output[:] for n in nodes]

    def one_pass(reads: list[list[str]], writes: list[list[str]]) -> float:
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            producer = {o: k for k, outs in enumerate(writes) for o in outs}
            get = producer.get
            [[get(t) for t in ins] for ins in reads]
            every = set(producer)
            every.update(t for ins in reads for t in ins)
            return time.perf_counter() - t0
        finally:
            gc.enable()

    a, b = names(small), names(large)
    ta, tb = [], []
    for _ in range(max(9, repeat)):  # (interleaved: load from elsewhere hits both alike)
        ta.append(one_pass(*a))
        tb.append(one_pass(*b))
    return med(tb) / med(ta)


def _chain_stages(small: tuple[int, Path], large: tuple[int, Path], repeat: int) -> None:
    """The two largest chains' fix, stage by stage (main thread, medians of ``repeat`` fixes with
    the stage wrappers on, apart from the timed runs): each stage's seconds on both, their ratio and
    what the large chain spends on it beyond the node ratio (the stages a 12x target rests on)."""
    from fixer.api import FixOptions, fix

    def stages(path: Path) -> dict[str, float]:
        def run():
            gc.collect()
            fix(path, FixOptions(dry_run=True))

        return _stage_times(FIX_STAGES, run, repeat)

    (n0, p0), (n1, p1) = small, large
    a, b = stages(p0), stages(p1)
    scale = n1 / n0
    print(f"  fix stages, main thread (s): {n0} -> {n1} nodes, ratio, beyond {scale:.1f}x the small chain's")
    for label in [k for _, _, k in FIX_STAGES if k in a or k in b]:
        x, y = a.get(label, 0.0), b.get(label, 0.0)
        ratio = f"{y / x:5.1f}x" if x >= 0.001 else "   --"  # (not a ratio of a stage the small chain skips)
        print(f"    {label:52s} {x:6.3f} -> {y:6.3f}  {ratio}  {y - scale * x:+6.3f}")


_QUANTIZE_CHILD = """
import onnx
from fixer.api import FixOptions, fix
from fixer.quantize import CalibrationOptions
out = sys.argv[2]
# sys.argv[3]: calibration samples (random data); absent: nafix's default (CalibrationOptions.random_samples)
calib = CalibrationOptions(seed=0, random_samples=int(sys.argv[3])) if len(sys.argv) > 3 else CalibrationOptions(seed=0)
r = fix(sys.argv[1], FixOptions(output=out, force=True, quantize=True, calib=calib))
OUT = {"nodes": len(onnx.load(out).graph.node)}
"""

_PLAIN_CHILD = """
import onnx, numpy as np, tempfile
from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
m = onnx.load(sys.argv[1])
class R:
    def __init__(self):
        rng = np.random.default_rng(0)
        i = m.graph.input[0]
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        self.feeds = [{i.name: rng.random(shape, dtype=np.float32)} for _ in range(int(sys.argv[3]))]
    def get_next(self):
        return self.feeds.pop(0) if self.feeds else None
quantize_static(sys.argv[1], sys.argv[2], R(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
"""

_NAFIX_Q_CHILD = """
import onnx
from fixer.quantize import CalibrationOptions, quantize_float_model
q = quantize_float_model(onnx.load(sys.argv[1]), calib=CalibrationOptions(seed=0, max_samples=int(sys.argv[3])))
onnx.save(q.model, sys.argv[2])
"""


def bench_quantize(folder: Path, samples: int = 16, repeat: int = 2) -> None:
    """--quantize at scale (child processes: wall, CPU, peak RSS); the YOLOv8n figures are medians of
    ``max(2, repeat)`` interleaved runs of each side."""
    with tempfile.TemporaryDirectory(prefix="nafix-bench-") as tmp:
        gtcrn = folder / "gtcrn__gtcrn_simple.onnx"
        if gtcrn.is_file():
            r = _child(_QUANTIZE_CHILD, str(gtcrn), str(Path(tmp) / "gtcrn_q.onnx"))
            print(f"nafix gtcrn --quantize ({r['nodes']} nodes out): {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
                  f"{r['rss_mib']:.0f} MiB (target < 30 s; 354 s before the linear-time adapters)")
        chain = Path(tmp) / "chain_float.onnx"
        onnx.save(float_chain(2850), chain)
        r = _child(_NAFIX_Q_CHILD, str(chain), str(Path(tmp) / "chain_q.onnx"), str(samples))
        n = len(onnx.load(str(Path(tmp) / "chain_q.onnx")).graph.node)
        print(f"quantize_float_model, synthetic chain ({n} nodes out): {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU, "
              f"{r['rss_mib']:.0f} MiB (target < 30 s)")
        yolo = folder / "magnus__yolov8n_int8.onnx"
        if yolo.is_file():
            fl = Path(tmp) / "yolov8n_float.onnx"
            onnx.save(dequantized(onnx.load(str(yolo))), fl)
            size = fl.stat().st_size / 2**20
            runs = {"plain": [], "nafix": [], "full": []}
            for _ in range(max(2, repeat)):  # interleaved
                runs["plain"].append(_child(_PLAIN_CHILD, str(fl), str(Path(tmp) / "y_plain.onnx"), str(samples)))
                runs["nafix"].append(_child(_NAFIX_Q_CHILD, str(fl), str(Path(tmp) / "y_nafix.onnx"), str(samples)))
                runs["full"].append(_child(_QUANTIZE_CHILD, str(fl), str(Path(tmp) / "y_full.onnx"), str(samples)))
            p = {k: med([x[k] for x in runs["plain"]]) for k in ("wall_s", "cpu_s", "rss_mib")}
            q = {k: med([x[k] for x in runs["nafix"]]) for k in ("wall_s", "cpu_s", "rss_mib")}
            print(f"float YOLOv8n ({size:.1f} MB, dequantized from {yolo.name}), {samples} samples, medians of "
                  f"{len(runs['plain'])} interleaved runs: nafix "
                  f"quantize_float_model {q['wall_s']:.1f} s / {q['cpu_s']:.1f} s CPU / {q['rss_mib']:.0f} MiB; plain "
                  f"quantize_static {p['wall_s']:.1f} s / {p['cpu_s']:.1f} s CPU / {p['rss_mib']:.0f} MiB; ratio "
                  f"{q['wall_s'] / p['wall_s']:.2f}x time, {q['cpu_s'] / p['cpu_s']:.2f}x CPU, "
                  f"{q['rss_mib'] / p['rss_mib']:.2f}x memory (target <= 1.5x)")
            f = {k: med([x[k] for x in runs["full"]]) for k in ("wall_s", "cpu_s", "rss_mib")}
            from fixer.quantize import CalibrationOptions

            default = CalibrationOptions().random_samples
            print(f"  whole `nafix MODEL --quantize` on it (float rewrites, quantization, accuracy report, gate, "
                  f"writing), the same {samples} calibration samples (nafix's default: {default}): "
                  f"{f['wall_s']:.1f} s / {f['cpu_s']:.1f} s CPU / {f['rss_mib']:.0f} MiB; "
                  f"{f['wall_s'] / p['wall_s']:.2f}x time, {f['cpu_s'] / p['cpu_s']:.2f}x CPU, "
                  f"{f['rss_mib'] / p['rss_mib']:.2f}x memory of plain quantize_static (target <= 1.5x)")


def bench_onnxslim(folder: Path, repeat: int) -> None:
    """`nafix MODEL` (fix + gate, written) vs onnxslim on each model, interleaved runs."""
    try:
        import onnxslim
    except ImportError:
        print("nafix MODEL vs onnxslim: skipped (onnxslim is not installed; pip install onnxslim)")
        return
    import contextlib
    import io
    import logging

    from fixer.api import FixOptions, fix

    logging.getLogger("onnxslim").setLevel(logging.ERROR)
    worst = (0.0, "")
    slower = 0
    refused: list[str] = []
    models = sorted(folder.glob("*.onnx"))
    with tempfile.TemporaryDirectory(prefix="nafix-bench-") as tmp:
        for p in models:
            n_t, s_t = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                try:
                    fix(p, FixOptions(output=str(Path(tmp) / "out.nafix.onnx"), force=True))
                except Exception as exc:  # noqa: BLE001 - a refused model still costs its time
                    refused.append(f"{p.name}: {type(exc).__name__}")
                n_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                try:
                    with contextlib.redirect_stdout(io.StringIO()):  # its per-model summary table
                        onnxslim.slim(str(p), str(Path(tmp) / "out.slim.onnx"))
                except Exception:  # noqa: BLE001
                    pass
                s_t.append(time.perf_counter() - t0)
            ratio = med(n_t) / med(s_t)
            slower += ratio > 1
            worst = max(worst, (ratio, p.name))
            print(f"  {p.name}: nafix {med(n_t):.2f} s, onnxslim {med(s_t):.2f} s, ratio {ratio:.2f}x", flush=True)
    print(f"nafix MODEL vs onnxslim ({onnxslim.__version__}) on {len(models)} models: slower on {slower}; "
          f"worst {worst[0]:.2f}x ({worst[1]}) (target <= 1.0x on every model)"
          + (f"; nafix raised on {len(set(refused))}: {', '.join(sorted(set(refused)))}" if refused else ""))


def run(sections: str, folder: Path, repeat: int) -> None:
    chosen = {"audit", "chains", "quantize", "onnxslim"} if sections == "all" else set(sections.split(","))
    print(f"speed at scale (issue 13): {os.cpu_count()} CPUs, load average {_load()} at start; "
          f"medians; ratios are within this run")
    if "audit" in chosen:
        bench_audit(folder, repeat)
    if "chains" in chosen:
        bench_chains(repeat)
    if "quantize" in chosen:
        bench_quantize(folder, repeat=repeat)
    if "onnxslim" in chosen:
        bench_onnxslim(folder, repeat)
    print(f"load average at end {_load()}")
