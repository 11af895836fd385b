"""The import check: the imported QDQ ONNX graph against the TFLite interpreter on seeded inputs.

Two comparisons on the same seeded inputs:

* **op by op**: every quantized tensor an operator produces is recomputed by onnxruntime from the
  interpreter's own values of that operator's inputs (the imported graph with each quantized tensor
  cut and fed from the interpreter), so one operator's rounding does not hide or pile up behind
  another's. TFLite requantizes with a fixed-point multiplier and rounds half away from zero;
  QuantizeLinear rounds the float result half to even. The two agree except where the exact result
  lies within a rounding step of a .5 tie, so an operator may differ by at most
  :data:`OP_TOLERANCE_LSB`; more means the import is wrong and the model is refused with the operator
  named.
* **end to end**: the graph outputs. Int8 outputs are compared in LSB, float outputs relative to
  their largest magnitude. A one-LSB tie inside the network can move later values by more than one
  LSB, so end-to-end figures are reported (max LSB, fraction of values bit-exact), not used to refuse.

The interpreter is ``ai-edge-litert`` (or ``tflite-runtime``, or TensorFlow's ``tf.lite``); without
one the check is not run and says so (``nafix[tflite]`` installs it).
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ..randomdata import uniform
from .tflite import NCHW, ImportedTFLite

#: Largest per-operator difference accepted, in LSB of the operator's output (rounding ties).
OP_TOLERANCE_LSB = 1
#: Float outputs: relative difference (to the output's largest magnitude) counted as exact.
FLOAT_RTOL = 1e-5


from ._tflite_worker import interpreter_class, make_interpreter  # noqa: E402,F401  (the check's runtime)


@dataclass
class OutputDiff:
    name: str
    dtype: str
    max_lsb: int | None  # int8 outputs, or float outputs behind a DEQUANTIZE (in its LSB)
    exact_fraction: float
    max_rel: float

    def as_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "max_lsb": self.max_lsb,
                "exact_fraction": round(self.exact_fraction, 6), "max_rel": float(self.max_rel)}


@dataclass
class ImportCheck:
    """What the interpreter comparison found."""

    checked: bool
    ok: bool
    runtime: str = ""
    reason: str = ""
    samples: int = 0
    ops_checked: int = 0
    op_max_lsb: int = 0
    ops_off_by_one: int = 0
    worst_op: str = ""
    outputs: list[OutputDiff] = field(default_factory=list)
    #: TFLite operator -> how many of its outputs had a one-LSB rounding tie somewhere.
    ties_by_op: dict[str, int] = field(default_factory=dict)
    #: The interpreter itself rejected, failed on or crashed on the model (nothing was compared).
    interpreter_failed: bool = False
    #: TFLite operator -> the largest distance (in LSB) from a .5 rounding tie of a value the QDQ graph
    #: rounded one LSB away from the interpreter (0 = exactly on a tie).
    tie_distance_by_op: dict[str, float] = field(default_factory=dict)

    @property
    def bit_exact(self) -> bool:
        return self.checked and self.ok and all(o.exact_fraction == 1.0 for o in self.outputs)

    def summary(self) -> str:
        if not self.checked:
            return f"import not checked against the TFLite interpreter: {self.reason}"
        if not self.ok:
            return f"import check failed: {self.reason}"
        outs = ", ".join(
            f"{o.name} {o.dtype}: " + (f"max {o.max_lsb} LSB, " if o.max_lsb is not None else "")
            + f"{100 * o.exact_fraction:.2f}% exact" for o in self.outputs)
        near = (f", every differing value within {max(self.tie_distance_by_op.values()):.2g} LSB of a .5 tie"
                if self.tie_distance_by_op else "")
        ops = (f"{self.ops_checked} quantized op outputs within {self.op_max_lsb} LSB "
               f"({self.ops_off_by_one} with a one-LSB rounding tie{near})" if self.ops_checked
               else f"float model, outputs within {FLOAT_RTOL:g} relative")
        return f"import checked against {self.runtime} on {self.samples} seeded input(s): {ops}; outputs {outs}"


    def as_dict(self) -> dict:
        return {"checked": self.checked, "ok": self.ok, "runtime": self.runtime, "reason": self.reason,
                "samples": self.samples, "ops_checked": self.ops_checked, "op_max_lsb": self.op_max_lsb,
                "ops_off_by_one": self.ops_off_by_one, "ties_by_op": self.ties_by_op,
                "tie_distance_by_op": self.tie_distance_by_op, "worst_op": self.worst_op,
                "op_tolerance_lsb": OP_TOLERANCE_LSB, "outputs": [o.as_dict() for o in self.outputs]}


def seeded_inputs(imp: ImportedTFLite, *, seed: int, samples: int) -> list[dict[str, np.ndarray]]:
    """Seeded inputs in each input's TFLite shape and dtype; a float input feeding a quantization gets
    the range that quantization represents, integer inputs their whole range."""
    rng = np.random.default_rng(seed)
    ranges = _float_input_ranges(imp.model)
    by_name = {i.name: i for i in imp.model.graph.input}
    out = []
    for _ in range(samples):
        feed = {}
        for name in imp.input_names:
            vi = by_name[name]
            shape = [max(int(d.dim_value), 1) for d in vi.type.tensor_type.shape.dim]
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
            if dt.kind == "f":
                lo, hi = sorted(ranges.get(name, (-1.0, 1.0)))
                if not (np.isfinite(lo) and np.isfinite(hi)) or hi - lo > 1e30:
                    lo, hi = -1.0, 1.0
                feed[name] = uniform(rng, lo, hi, shape, dt)
            elif dt == np.bool_:
                feed[name] = rng.integers(0, 2, size=shape).astype(dt)
            elif name in imp.index_bounds:  # indices: the interpreter refuses one out of range
                feed[name] = rng.integers(0, imp.index_bounds[name], size=shape).astype(dt)
            else:
                info = np.iinfo(dt)
                lo, hi = max(info.min, -128), min(info.max, 255)
                feed[name] = rng.integers(lo, hi + 1, size=shape).astype(dt)
        out.append(feed)
    return out


def _float_input_ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    ranges = {}
    names = {i.name for i in model.graph.input}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in names:
            s, z = inits.get(n.input[1]), inits.get(n.input[2])
            if s is None or z is None or s.size != 1 or z.size != 1:
                continue
            info = np.iinfo(z.dtype)
            zp, sc = int(z.reshape(-1)[0]), float(s.reshape(-1)[0])
            ranges[n.input[0]] = ((info.min - zp) * sc, (info.max - zp) * sc)
    return ranges


def _session(model: onnx.ModelProto):
    from ..runtime import runtime_session, session_options

    return runtime_session(model.SerializeToString(), session_options(), initializers=0)


def _fed_model(imp: ImportedTFLite) -> tuple[onnx.ModelProto, dict[int, str], dict[int, tuple]]:
    """The imported graph with every operator's quantized output also fed from outside; and, per such
    output, (the float tensor its QuantizeLinear rounds, scale, zero-point, and the input scale when that
    tensor is a DequantizeLinear's: a requantization, else None)."""
    model = onnx.ModelProto()
    model.CopyFrom(imp.model)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    pre: dict[int, tuple] = {}
    fed: dict[int, str] = {}
    rename = {}
    elems: dict[str, int] = {}
    producers = {o: n for n in g.node for o in n.output}
    for t, (qname, nchw) in imp.quantized_outputs.items():
        prod = producers.get(qname)
        if prod is None or prod.op_type != "QuantizeLinear" or qname in rename:
            continue
        zp_init = next((i for i in g.initializer if i.name == prod.input[2]), None)
        elem = zp_init.data_type if zp_init is not None else onnx.TensorProto.INT8
        new = qname + "__fed"
        rename[qname] = new
        fed[t] = new
        elems[qname] = elem
        g.input.append(helper.make_tensor_value_info(new, elem, None))
        if prod.input[1] in inits and zp_init is not None:
            sc = onnx.numpy_helper.to_array(inits[prod.input[1]]).reshape(-1)
            zp = onnx.numpy_helper.to_array(zp_init).reshape(-1)
            if sc.size == 1 and zp.size == 1:
                pre[t] = (prod.input[0], float(sc[0]), int(zp[0]), _dequantized_scale(producers, inits, prod.input[0]))
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in rename:
                n.input[k] = rename[i]
    outs = {o.name for o in g.output}
    for t, (qname, _) in imp.quantized_outputs.items():
        if t in fed and qname not in outs:
            g.output.append(helper.make_tensor_value_info(qname, elems[qname], None))
            outs.add(qname)
    for t, (name, *_) in list(pre.items()):
        if name in rename or name in {i.name for i in g.input}:
            del pre[t]
        elif name not in outs:
            g.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
            outs.add(name)
    return model, fed, pre


def _dequantized_scale(producers, inits, name: str) -> float | None:
    """The single scale of the DequantizeLinear that makes ``name``, if one does (the QuantizeLinear
    reading it then requantizes an integer tensor)."""
    dq = producers.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in inits:
        return None
    sc = onnx.numpy_helper.to_array(inits[dq.input[1]]).reshape(-1)
    return float(sc[0]) if sc.size == 1 else None


def _xnnpack_requantized(dequantized: np.ndarray, in_scale: float, out_scale: float, zp: int,
                         info) -> np.ndarray:
    """What XNNPACK, the interpreter's default CPU delegate, makes of an int8 -> int8 requantization: its
    multiplier keeps 8 fractional bits (round(256 * ratio) / 256, the ratio in float32), then rounds half
    up. Checked on a real YOLOv8n-pose's 4 QUANTIZE ops, 3 random inputs: every value equal. A value
    rounded this way is the delegate's approximation, not a fault of the import."""
    steps = np.rint(dequantized.astype(np.float64) / in_scale)
    mult = np.rint(256.0 * float(np.float32(in_scale) / np.float32(out_scale))) / 256.0
    return np.clip(np.floor(steps * mult + zp + 0.5), info.min, info.max)


#: Seconds the interpreter child process may take (a large model with every tensor kept).
INTERPRETER_TIMEOUT_S = 600.0
#: The script the child process runs (imports numpy and the interpreter only).
WORKER = Path(__file__).with_name("_tflite_worker.py")


class InterpreterFailed(Exception):
    """The TFLite interpreter rejected, failed on, or crashed on the model (message: why)."""


def run_interpreter(data: bytes, feeds: list[list[np.ndarray]], *, tensors=(), preserve: bool = False,
                    timeout_s: float = INTERPRETER_TIMEOUT_S) -> tuple[str, list[dict]]:
    """Run the TFLite interpreter on ``feeds`` (per sample, arrays in the subgraph's input order) in a
    child process (the interpreter is native code that can crash on a hostile model).

    Returns (runtime name, per sample ``{"outputs": [arrays in output order], "tensors": {index:
    array}}``); raises :class:`InterpreterFailed` with the reason."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nafix-tflite-") as tmp:
        d = Path(tmp)
        (d / "model.tflite").write_bytes(bytes(data))
        (d / "request.json").write_text(json.dumps({"samples": len(feeds), "tensors": [int(t) for t in tensors],
                                                    "preserve": bool(preserve or tensors)}))
        np.savez(d / "inputs.npz", **{f"s{s}_{i}": x for s, feed in enumerate(feeds) for i, x in enumerate(feed)})
        try:
            proc = subprocess.run([sys.executable, str(WORKER), str(d)],
                                  capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise InterpreterFailed(f"the TFLite interpreter did not finish within {timeout_s:.0f} s") from None
        done = d / "done.json"
        if proc.returncode != 0 or not done.is_file():
            how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
            raise InterpreterFailed(f"the TFLite interpreter crashed on this model ({how})")
        info = json.loads(done.read_text())
        if "error" in info:
            raise InterpreterFailed(f"the TFLite interpreter rejects the model ({info['error']})")
        with np.load(d / "outputs.npz") as z:
            arrays = {k: z[k] for k in z.files}
    out = []
    for s in range(len(feeds)):
        outs = []
        k = 0
        while f"s{s}_o{k}" in arrays:
            outs.append(arrays[f"s{s}_o{k}"])
            k += 1
        out.append({"outputs": outs, "tensors": {int(t): arrays[f"s{s}_t{int(t)}"] for t in tensors}})
    return info["runtime"], out


def check_import(imp: ImportedTFLite, data: bytes, *, seed: int = 0, samples: int = 1) -> ImportCheck:
    """Compare the imported model with the TFLite interpreter (see the module docstring)."""
    if interpreter_class() is None:
        return ImportCheck(checked=False, ok=True,
                           reason="no TFLite interpreter installed (pip install 'nafix[tflite]')")
    feeds = seeded_inputs(imp, seed=seed, samples=samples)
    try:
        sess = _session(imp.model)
        fed_model, fed, pre = _fed_model(imp)
        fed_sess = _session(fed_model)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        return ImportCheck(checked=True, ok=False,
                           reason=f"onnxruntime cannot run the imported graph ({str(exc).splitlines()[0][:200]})")
    try:
        runtime, ref = run_interpreter(data, [[f[n] for n in imp.input_names] for f in feeds], tensors=list(fed))
    except InterpreterFailed as exc:
        return ImportCheck(checked=True, ok=False, reason=str(exc), interpreter_failed=True)
    res = ImportCheck(checked=True, ok=True, runtime=runtime, samples=len(feeds))
    try:
        return _compare(imp, ref, sess, fed, pre, fed_sess, feeds, res)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's own error types on a broken model
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return _fail(res, f"onnxruntime cannot run the imported graph ({first})")


def _compare(imp, ref, sess, fed, pre, fed_sess, feeds, res) -> ImportCheck:
    out_stats: dict[str, list] = {}
    tie_dist: dict[str, float] = {}
    worst = (-1, "")
    off_by_one = set()
    op_of = {t: (k, name) for k, (name, ts) in enumerate(imp.ops) for t in ts}
    dq_scale = _output_lsb(imp.model)
    for feed, r_s in zip(feeds, ref):
        got = dict(zip(imp.output_names, sess.run(imp.output_names, feed)))
        for name, r in zip(imp.output_names, r_s["outputs"]):
            out_stats.setdefault(name, []).append((r, got[name]))
        # Op by op: feed every quantized tensor from the interpreter.
        ffeed = dict(feed)
        for t, new in fed.items():
            v = r_s["tensors"][t]
            ffeed[new] = v.transpose(NCHW) if imp.quantized_outputs[t][1] else v
        want = [imp.quantized_outputs[t][0] for t in fed] + sorted({p[0] for p in pre.values()})
        vals = dict(zip(want, fed_sess.run(want, ffeed))) if want else {}
        for t in fed:
            qn, nchw = imp.quantized_outputs[t]
            r = r_s["tensors"][t]
            g = vals[qn]
            if nchw:
                g = g.transpose((0, 2, 3, 1))
            if r.shape != g.shape:
                k, opname = op_of.get(t, (-1, "?"))
                return _fail(res, f"operator #{k} {opname}: output shape {list(g.shape)} differs from "
                                  f"the interpreter's {list(r.shape)}")
            diff = int(np.abs(r.astype(np.int32) - g.astype(np.int32)).max()) if r.size else 0
            if diff > worst[0]:
                k, opname = op_of.get(t, (-1, "?"))
                worst = (diff, f"#{k} {opname} ('{qn}')")
            if diff == 1:
                off_by_one.add(t)
                if t in pre:  # how far from a .5 rounding tie the values that differ are
                    name, sc, zp, in_scale = pre[t]
                    v = vals[name].astype(np.float64) / sc + zp
                    if nchw:
                        v = v.transpose((0, 2, 3, 1))
                    hit = np.abs(r.astype(np.int32) - g.astype(np.int32)) == 1
                    if in_scale is not None:  # a requantization: values the delegate rounded its way are explained
                        x = _xnnpack_requantized(vals[name], in_scale, sc, zp, np.iinfo(r.dtype))
                        hit &= r != (x.transpose((0, 2, 3, 1)) if nchw else x)
                    # a value rounded differently is within this distance (in LSB) of x.5; beyond the int8
                    # range saturation decides, not rounding
                    vin = v[hit]
                    info = np.iinfo(r.dtype)
                    vin = vin[(vin > info.min - 0.5) & (vin < info.max + 0.5)]
                    if vin.size:
                        d = float(np.max(np.abs(vin - np.floor(vin) - 0.5)))
                        k, opname = op_of.get(t, (-1, "?"))
                        tie_dist[opname] = max(tie_dist.get(opname, 0.0), d)
    res.ops_checked = len(fed)
    res.op_max_lsb = max(worst[0], 0)
    res.worst_op = worst[1]
    res.ops_off_by_one = len(off_by_one)
    res.ties_by_op = dict(sorted(Counter(op_of.get(t, (-1, "?"))[1] for t in off_by_one).items()))
    res.tie_distance_by_op = {k: round(v, 6) for k, v in sorted(tie_dist.items())}
    for name, pairs in out_stats.items():
        r = np.stack([p[0] for p in pairs])
        g = np.stack([p[1] for p in pairs])
        if r.shape != g.shape:
            return _fail(res, f"output '{name}' has shape {list(g.shape[1:])}, the interpreter's is {list(r.shape[1:])}")
        res.outputs.append(_diff(name, r, g, dq_scale.get(name)))
    if not fed:  # a float model: nothing rounds to int8, so its float outputs must agree to FLOAT_RTOL
        for o in res.outputs:
            if o.dtype.startswith("float") and o.max_rel > FLOAT_RTOL:
                return _fail(res, f"float output '{o.name}' differs from the TFLite interpreter by {o.max_rel:.2g} "
                                  f"of its largest magnitude (at most {FLOAT_RTOL:g} is float rounding)")
    if res.op_max_lsb > OP_TOLERANCE_LSB:
        return _fail(res, f"operator {res.worst_op} differs from the TFLite interpreter by {res.op_max_lsb} LSB "
                          f"given the same inputs (at most {OP_TOLERANCE_LSB} is a rounding tie)")
    return res


def _fail(res: ImportCheck, reason: str) -> ImportCheck:
    res.ok = False
    res.reason = reason
    return res


def _output_lsb(model: onnx.ModelProto) -> dict[str, float]:
    """Float graph outputs made by a per-tensor DequantizeLinear: their LSB (scale)."""
    inits = {t.name: t for t in model.graph.initializer}
    lsb = {}
    prod = {o: n for n in model.graph.node for o in n.output}
    for o in model.graph.output:
        n = prod.get(o.name)
        if n is not None and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            s = onnx.numpy_helper.to_array(inits[n.input[1]])
            if s.size == 1:
                lsb[o.name] = float(s)
    return lsb


def compare_model(imp: ImportedTFLite, model: onnx.ModelProto, *, io_changes=(), seed: int = 0,
                  samples: int = 1) -> list[OutputDiff] | None:
    """A rewritten model against the TFLite interpreter on the same seeded inputs as the import check.

    ``io_changes`` (:class:`fixer.rewriters.IoChange`) are the edges a rewrite made int8: such an input
    is fed the interpreter's float input quantized as the application would (round half to even), such
    an output is dequantized with its recorded scale and zero-point before the comparison. None when
    no interpreter is installed or the model's interface is not the TFLite one up to those changes."""
    from ..gate import dequantize, quantize_like_ort

    if interpreter_class() is None:
        return None
    changed_in = {c.name: c for c in io_changes if c.kind == "input"}
    changed_out = {c.name: c for c in io_changes if c.kind == "output"}
    ins = {i.name for i in model.graph.input}
    outs = {o.name for o in model.graph.output}
    if ins != set(imp.input_names) or outs != set(imp.output_names):
        return None
    if any(isinstance(c.scale, list) for c in io_changes):
        return None
    feeds = seeded_inputs(imp, seed=seed, samples=samples)
    try:
        _, ref = run_interpreter(imp.data, [[f[n] for n in imp.input_names] for f in feeds])
    except InterpreterFailed:
        return None
    sess = _session(model)
    lsb = _output_lsb(imp.model)
    pairs: dict[str, list] = {}
    for feed, r_s in zip(feeds, ref):
        mfeed = {k: (quantize_like_ort(v, changed_in[k].scale, changed_in[k].zero_point, changed_in[k].dtype)
                     if k in changed_in else v) for k, v in feed.items()}
        got = dict(zip(imp.output_names, sess.run(imp.output_names, mfeed)))
        for name, c in changed_out.items():
            got[name] = dequantize(got[name], c.scale, c.zero_point)
        for name, r in zip(imp.output_names, r_s["outputs"]):
            pairs.setdefault(name, []).append((r, got[name]))
    return [_diff(name, np.stack([p[0] for p in ps]), np.stack([p[1] for p in ps]), lsb.get(name))
            for name, ps in pairs.items()]


def _diff(name: str, r: np.ndarray, g: np.ndarray, lsb: float | None) -> OutputDiff:
    if r.dtype.kind == "f":
        err = np.abs(r.astype(np.float64) - g)
        den = float(np.abs(r).max()) or 1.0
        max_lsb = int(np.rint(err.max() / lsb)) if lsb and err.size else None
        exact = float(np.mean(err <= FLOAT_RTOL * den)) if err.size else 1.0
        return OutputDiff(name, str(r.dtype), max_lsb, exact, float(err.max()) / den if err.size else 0.0)
    d = np.abs(r.astype(np.int64) - g.astype(np.int64))
    return OutputDiff(name, str(r.dtype), int(d.max()) if d.size else 0,
                      float(np.mean(d == 0)) if d.size else 1.0, 0.0)
