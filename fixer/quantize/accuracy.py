"""Float vs quantized outputs (cosine, SNR, max abs error) and the tensors with the lowest SQNR
(:func:`accuracy_report`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from ..errors import UsageError
from .modelproto import _clamp_ir, _copy, _quiet_onnxruntime

log = logging.getLogger(__name__)


@dataclass
class QuantAccuracy:
    """Float vs quantized: per output ``{name, cosine, snr_db, max_abs_error}``, and the ``worst_tensors``
    ``{tensor, sqnr_db}`` (lowest SQNR of the quantized model's activations against the float
    model's, from ``onnxruntime.quantization.qdq_loss_debug``)."""

    calibration: str
    outputs: list[dict]
    worst_tensors: list[dict]
    samples: int = 0

    def as_dict(self) -> dict:
        # "samples" is the calibration's count where a calibration result is merged with this one
        return {"calibration": self.calibration, "accuracy_samples": self.samples, "outputs": list(self.outputs),
                "worst_tensors": list(self.worst_tensors)}


def _session(model: onnx.ModelProto):
    from ..gate import session

    return session(model)


def accuracy_report(float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                    feeds: Sequence[Mapping[str, np.ndarray]], *, calibration: str = "random", worst: int = 10,
                    debug_samples: int = 4,
                    reference: Sequence[Mapping[str, np.ndarray]] | None = None,
                    meanwhile: Callable[[Callable[[Mapping[str, np.ndarray], Sequence[str]], list | None]], object]
                    | None = None) -> QuantAccuracy:
    """Compare a quantized model with its float reference on ``feeds``.

    Outputs (matched by name; integer outputs are compared as their values): cosine similarity,
    SNR in dB (``10 log10(sum ref^2 / sum err^2)``, ``inf`` when identical) and max abs error over
    all feeds. ``worst_tensors``: the ``worst`` activations with the lowest SQNR (20 log10 of the
    norm ratio, onnxruntime's ``compute_signal_to_quantization_noice_ratio``) between the float
    model's tensor and the quantized model's dequantized tensor, on the first ``debug_samples``
    feeds (one sample's intermediate tensors are held at a time).

    ``reference``: the float model's outputs on ``feeds`` (one ``{output name: value}`` per feed)
    when they are known already, e.g. recorded from onnxruntime's calibration runs
    (:attr:`~fixer.quantize.ort.QuantizeResult.reference`): the float model is then not run again
    for the output figures. Each model is run at most once per feed, in one session per model: the
    sessions that give the per-tensor SQNR also give the outputs (:class:`_ProbeRunner`).

    ``meanwhile``: called once, with ``float_run(feed, names)``, after the report's sessions are made
    and before it runs the feeds: another check of ``float_model`` (the rewrites' equivalence gate)
    whose inputs are the report's first feeds takes the float model's values of ``names`` on such a
    feed from the report's own run of it (``float_run`` runs the report's next feed, fetching
    ``names`` too, when ``feed`` is that feed and the report runs the float model on it; otherwise
    it returns None and runs nothing). What it raises propagates (the report is abandoned); the
    figures are those of a report made without it.
    """
    feeds = list(feeds)
    if not feeds:
        raise UsageError("the accuracy report needs at least one input sample.")
    if reference is not None and len(reference) != len(feeds):
        raise ValueError(f"reference outputs for {len(reference)} feed(s), not {len(feeds)}")
    names = [o.name for o in float_model.graph.output]
    q_names = {o.name for o in quant_model.graph.output}
    q_inputs = {i.name for i in quant_model.graph.input} - {t.name for t in quant_model.graph.initializer}
    compared = [n for n in names if n in q_names]
    runs = _ProbeRuns([], {}, {})
    runner = None
    if worst > 0:
        runner = _ProbeRunner(float_model, quant_model, feeds, worst, outputs=compared, debug=max(1, debug_samples),
                              float_outputs=names if reference is None else (), lazy_float=meanwhile is not None)
    if meanwhile is not None:
        meanwhile(runner.float_run if runner is not None else (lambda feed, names: None))
    if runner is not None:
        runs = runner.finish()
        del runner
    acc: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in compared}
    s_f = s_q = None
    for i, feed in enumerate(feeds):
        if reference is not None:
            ref = reference[i]
        else:
            ref = runs.float.pop(i, None)
            if ref is None:
                s_f = s_f or _session(float_model)
                ref = dict(zip(names, s_f.run(names, dict(feed))))
        got = runs.quantized.pop(i, None)
        if got is None:
            s_q = s_q or _session(quant_model)
            got = dict(zip(compared, s_q.run(compared, {k: v for k, v in feed.items() if k in q_inputs})))
        for n in compared:
            acc[n].append((np.asarray(ref[n]), np.asarray(got[n])))
    del s_f, s_q
    outputs = []
    for n in names:
        if n not in acc:
            outputs.append({"name": n, "cosine": None, "snr_db": None, "max_abs_error": None,
                            "detail": "missing from the quantized model"})
            continue
        a = np.concatenate([r.reshape(-1) for r, _ in acc[n]], dtype=np.float64, casting="unsafe")
        b = np.concatenate([g.reshape(-1) for _, g in acc[n]], dtype=np.float64, casting="unsafe")
        outputs.append({"name": n, **_compare(a, b)})
    return QuantAccuracy(calibration, outputs, runs.rows, len(feeds))


def _compare(a: np.ndarray, b: np.ndarray) -> dict:
    """Cosine, SNR and max abs error of ``b`` against ``a`` (float64 arrays, same size). The same
    numpy reductions over the same values as ``a - b``, ``np.sum(diff ** 2)``, ``np.sum(a ** 2)``
    and ``np.abs(diff).max()``, with one scratch array instead of four (they are ~45 MB each for
    8 samples of a detector's output)."""
    if a.shape != b.shape:
        return {"cosine": 0.0, "snr_db": float("-inf"), "max_abs_error": float("inf"), "detail": "shapes differ"}
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    diff = np.subtract(a, b)
    # |d| is exact, so the largest |d| is the larger of max(d) and -min(d) (NaN propagates in both;
    # + 0.0 turns the -0.0 of all-zero differences into the 0.0 |d| gives)
    max_abs = float(max(diff.max(), -diff.min())) + 0.0 if diff.size else 0.0
    noise = float(np.sum(np.multiply(diff, diff, out=diff)))
    signal = float(np.sum(np.multiply(a, a, out=diff)))
    snr = float("inf") if noise == 0 else float(10 * np.log10(max(signal, 1e-30) / noise))
    return {"cosine": cosine, "snr_db": snr, "max_abs_error": max_abs}


def _saved_tensors(model: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """The tensors onnxruntime's ``qdq_loss_debug.modify_model_output_intermediate_tensors`` saves,
    in graph order: every float or float16 input or output of a node that is not an initializer and
    whose type shape inference knows (``CalibraterBase.select_tensors_to_calibrate`` with no op type
    filter, on the shape-inferred model); with their element types."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    infos = {vi.name: vi for vi in g.value_info}
    infos.update({o.name: o for o in g.output})
    infos.update({i.name: i for i in g.input})
    inits = {t.name for t in g.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    out: dict[str, int] = {}
    for node in g.node:
        for name in (*node.input, *node.output):
            vi = infos.get(name)
            if (name and name not in out and name not in inits and vi is not None and vi.type.HasField("tensor_type")
                    and vi.type.tensor_type.elem_type in floats):
                out[name] = vi.type.tensor_type.elem_type
    return list(out), out


@dataclass(frozen=True)
class _Dequantizer:
    """A per-tensor ``DequantizeLinear`` of int8 or uint8 values with constant parameters: its
    quantized input ``src`` (ONNX element type ``elem``), ``zero`` and ``scale``."""

    src: str
    elem: int
    zero: int
    scale: np.float32

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``float32(int32(x) - zero) * scale`` element by element, one rounding (ONNX's definition,
        onnxruntime's kernel), as a new float32 array: the difference is a small integer, exact in
        float32 (what ``astype`` and ``-=`` give), and the product rounds once, so the result is bit
        for bit the float tensor, which then need not be a graph output of the probe (a quarter of
        the bytes, and one float tensor held at a time)."""
        y = np.asarray(x).astype(np.float32)
        y -= np.float32(self.zero)
        y *= self.scale
        return y


def _per_tensor_dequantizers(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, _Dequantizer]:
    """For each tensor among ``names`` that a per-tensor DequantizeLinear of int8 or uint8 values
    writes, with scale and zero-point initializers: how to compute it from its quantized input."""
    inits = {t.name: t for t in model.graph.initializer}
    wanted = set(names)
    out: dict[str, _Dequantizer] = {}
    for n in model.graph.node:
        if (n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or len(n.input) != 3
                or not n.output or n.output[0] not in wanted or any(a.name != "axis" for a in n.attribute)):
            continue
        s, z = inits.get(n.input[1]), inits.get(n.input[2])
        if s is None or z is None or s.data_type != onnx.TensorProto.FLOAT:
            continue
        scale, zero = onnx.numpy_helper.to_array(s), onnx.numpy_helper.to_array(z)
        if scale.size != 1 or zero.size != 1 or zero.dtype not in (np.int8, np.uint8):
            continue
        out[n.output[0]] = _Dequantizer(n.input[0], z.data_type, int(zero.reshape(-1)[0]),
                                        np.float32(scale.reshape(-1)[0]))
    return out


class _Probe:
    """A model whose chosen intermediate tensors are graph outputs, run under the options of the
    accuracy sessions (no graph optimization: the models as written). A tensor that is a graph input
    is read from the feed (onnxruntime's saved copy of it holds the same values).

    ``run(..., reuse=True)``: the intermediate tensors of this run are written into the arrays the
    previous ``reuse`` run returned (the caller is done with them), through onnxruntime's I/O
    binding, instead of into fresh memory: the same kernels on the same inputs write the same bits,
    without the page faults of a few hundred MB of new buffers per sample. The model's own graph
    outputs are always fresh arrays (callers keep them)."""

    def __init__(self, aug: onnx.ModelProto, tensors: Sequence[str], types: Mapping[str, int]):
        """``aug``: a copy of the model, made the probe's model in place."""
        from onnx import helper

        from ..runtime import runtime_session, session_options

        self.inputs = {i.name for i in aug.graph.input} - {t.name for t in aug.graph.initializer}
        self.own_outputs = {o.name for o in aug.graph.output}
        present = set(self.own_outputs)
        for name in tensors:
            if name not in present and name not in self.inputs:
                # a tensor of unknown type (asked for by another check) as the gate adds it: untyped
                aug.graph.output.append(helper.make_tensor_value_info(name, types[name], None) if name in types
                                        else onnx.ValueInfoProto(name=name))
                present.add(name)
        self.outputs = present  # what a run may fetch, besides the inputs
        data = aug.SerializeToString()
        # many intermediate tensors are outputs here: without the arena each run's buffers go back
        # to the system instead of growing the session's pool (the time it costs is page faults).
        # Idle worker threads sleep instead of spinning: scheduling only (the same kernels, the same
        # bits); on a loaded 2-core machine the spinning took ~40% more CPU time for the same runs
        so = session_options(arena=False, spinning=False)
        self.session = runtime_session(data, so, initializers=0)
        self._last: dict[str, np.ndarray] = {}  # intermediate arrays of the last reuse run
        self._last_inputs: dict[str, tuple] = {}

    def run(self, names: Sequence[str], feed: Mapping[str, np.ndarray], *, reuse: bool = False) -> dict[str, np.ndarray]:
        fetch = list(dict.fromkeys(n for n in names if n not in self.inputs))
        inputs = {k: v for k, v in feed.items() if k in self.inputs}
        values = self._run_into(fetch, inputs) if reuse and self._last else None
        if values is None:
            values = dict(zip(fetch, self.session.run(fetch, inputs)))
        if reuse:
            self._last = {n: v for n, v in values.items() if n not in self.own_outputs and isinstance(v, np.ndarray)
                          and v.flags.c_contiguous and v.flags.writeable}
            self._last_inputs = {k: (np.shape(v), np.asarray(v).dtype) for k, v in inputs.items()}
        values.update({n: np.asarray(feed[n]) for n in names if n in self.inputs})
        return values

    def release(self) -> None:
        """Forget the arrays kept for the next ``reuse`` run (their memory goes back)."""
        self._last, self._last_inputs = {}, {}

    def _run_into(self, fetch: list[str], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """One run with the intermediate tensors written into the last run's arrays; None when they
        may not fit (other input shapes or types) or onnxruntime declines, and the caller runs
        plainly."""
        if {k: (np.shape(v), np.asarray(v).dtype) for k, v in inputs.items()} != self._last_inputs:
            return None
        into = {n: self._last[n] for n in fetch if n in self._last}
        if not into:
            return None
        binding = self.session.io_binding()
        try:
            for k, v in inputs.items():
                binding.bind_cpu_input(k, np.ascontiguousarray(v))
            for n in fetch:
                if n in into:
                    a = into[n]
                    binding.bind_output(n, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
                else:
                    binding.bind_output(n, "cpu")
            self.session.run_with_iobinding(binding)
            got = binding.get_outputs()
            return {n: into[n] if n in into else np.array(v.numpy(), copy=True) for n, v in zip(fetch, got)}
        except Exception as exc:  # noqa: BLE001 - e.g. a tensor whose shape depends on the data
            log.debug("accuracy probe: bound run declined (%s); running plainly", exc)
            return None
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()


@dataclass
class _ProbeRuns:
    """What :class:`_ProbeRunner` computed: the ``worst`` rows, the quantized model's graph outputs on
    every feed and the float model's on the feeds it ran (feed index -> {name: value})."""

    rows: list[dict]
    quantized: dict[int, dict[str, np.ndarray]]
    float: dict[int, dict[str, np.ndarray]]


class _ProbeRunner:
    """The ``worst`` tensors by SQNR of the quantized model's values (DequantizeLinear outputs)
    against the float model's, over the first ``debug`` feeds (all when None): the tensors
    onnxruntime's ``qdq_loss_debug`` saves (:func:`_saved_tensors`), its tensor matching
    (``create_activation_matching``) and SQNR (``20 log10(|x| / |x - y|)`` over the samples
    concatenated), computed one sample at a time from running sums, so only one sample's activations
    are held at once (all samples' intermediate tensors of a 640x640 detector took 3.4 GiB). Only the
    matched tensors are made graph outputs.

    The same two sessions give the quantized model's graph ``outputs`` on every feed and, when
    ``float_outputs`` are named, the float model's on every feed: each model runs at most once per
    feed. (Running the float and the quantized run of a feed side by side in two threads took more
    CPU time and ~160 MB more memory on a loaded 2-core machine, for no gain: each run already
    keeps both cores busy.)

    The result is empty when the per-tensor view is unavailable (a diagnostic, not a gate: the failure is logged
    and the caller runs the models itself).

    The feeds run one at a time (:meth:`step`, in feed order; :meth:`finish` runs the rest and
    gives the result), so that another check may take the float model's values of a feed from the
    run made of it anyway (:meth:`float_run`) instead of running the float model again on the same
    input.

    ``lazy_float``: the float model's session is created at the first :meth:`float_run` (with the
    tensors asked for there among its outputs) or the first :meth:`step`, not at once."""

    def __init__(self, float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                 feeds: list[Mapping[str, np.ndarray]], worst: int, *, outputs: Sequence[str] = (),
                 debug: int | None = None, float_outputs: Sequence[str] = (), lazy_float: bool = False):
        self.feeds = feeds
        self.worst = worst
        self.n_debug = len(feeds) if debug is None else min(debug, len(feeds))
        self.outputs, self.float_outputs = list(outputs), list(float_outputs)
        self.sums: dict[str, list[float]] = {}  # tensor -> [sum x^2, sum (x - y)^2]
        self.q_got: dict[int, dict[str, np.ndarray]] = {}
        self.f_got: dict[int, dict[str, np.ndarray]] = {}
        self.next = 0  # the feed the next step runs
        self.ok = False  # False: nothing to run, or a failure (the result is then empty)
        self.pairs: list[tuple[str, str, str]] = []
        self.f_probe = self.q_probe = None
        self._float_model = None  # the float model's copy until its session is created (lazy_float)
        from onnxruntime.quantization.qdq_loss_debug import create_activation_matching

        try:
            with _quiet_onnxruntime():
                f_model, q_model = _copy(float_model), _copy(quant_model)
                _clamp_ir(f_model)
                _clamp_ir(q_model)
                f_saved, f_types = _saved_tensors(f_model)
                q_saved, q_types = _saved_tensors(q_model)
                # onnxruntime matches tensors by name only: match on the names (each standing for its
                # own values), then fetch just the matched tensors, one sample at a time
                f_names = {t: [t] for t in f_saved}
                q_names = {t: [t] for t in q_saved}
                matching = create_activation_matching(q_names, f_names)
                matching = {k: v for k, v in matching.items() if v.get("float")}
                if not matching:
                    matching = _match_by_qdq(quant_model, q_names, f_names)
                pairs = [(k, v["float"][0], v["post_qdq"][0]) for k, v in matching.items()
                         if v.get("float") and v.get("post_qdq")]
                self.f_req = sorted({f for _, f, _ in pairs})
                q_req = sorted({q for _, _, q in pairs})
                if not pairs:
                    return
                # dequantized tensors are computed from the int8 ones the probe outputs (bit for bit)
                self.dqs = _per_tensor_dequantizers(q_model, q_req)
                self.q_fetch = [self.dqs[q].src if q in self.dqs else q for q in q_req]
                q_types = {**q_types, **{d.src: d.elem for d in self.dqs.values()}}
                self.f_types = f_types
                if lazy_float:
                    self._float_model = f_model  # the probe's copy, made the probe's model later
                else:
                    self.f_probe = _Probe(f_model, self.f_req, f_types)
                self.q_probe = _Probe(q_model, self.q_fetch, q_types)
                del f_model, q_model
                self.pairs = pairs
                self.ok = True
        except Exception as exc:  # noqa: BLE001 - the per-tensor view is a diagnostic, not a gate
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        log.info("per-tensor SQNR unavailable: %s", exc)
        self.ok = False
        self.f_probe = self.q_probe = self._float_model = None
        self.sums, self.q_got, self.f_got = {}, {}, {}

    def _make_float(self, extra: Sequence[str] = ()) -> None:
        f_model = self._float_model  # made the probe's model in place: as it was, should that fail
        n = len(f_model.graph.output)
        try:
            self.f_probe = _Probe(f_model, [*self.f_req, *extra], self.f_types)
        except Exception:
            del f_model.graph.output[n:]
            raise
        self._float_model = None

    def pending(self) -> bool:
        return self.ok and self.next < len(self.feeds)

    def runs_float(self, i: int) -> bool:
        """Whether the step of feed ``i`` runs the float model."""
        return i < self.n_debug or bool(self.float_outputs)

    def float_run(self, feed: Mapping[str, np.ndarray], names: Sequence[str]) -> list | None:
        """The float model's values of ``names`` on ``feed`` (in that order), from the step of the next
        feed when ``feed`` is that feed (the same arrays: names, types, shapes, values) and the step
        runs the float model anyway; None otherwise (nothing ran), or when the step failed. The
        values are the caller's (copies where the report would write into them again)."""
        if not self.pending() or not self.runs_float(self.next) or not _same_feed(feed, self.feeds[self.next]):
            return None
        names = list(names)
        try:
            with _quiet_onnxruntime():
                if self.f_probe is None:
                    try:
                        self._make_float([n for n in names if n not in self.f_req])
                    except Exception:  # noqa: BLE001 - not with these: the report's own session, as before
                        self._make_float()
                if any(n not in self.f_probe.outputs and n not in self.f_probe.inputs for n in names):
                    return None
                vals = self.step(extra=names)
        except Exception as exc:  # noqa: BLE001 - the diagnostic fails; the caller runs the model itself
            self._fail(exc)
            return None
        if vals is None:
            return None
        own = self.f_probe.own_outputs if self.f_probe is not None else set()
        return [vals[n] if n in own else np.array(vals[n], copy=True) for n in names]

    def step(self, extra: Sequence[str] = ()) -> dict[str, np.ndarray] | None:
        """Run the next feed: the quantized model, the float model where it is needed (``extra``:
        float model tensors fetched besides), the running SQNR sums. Returns the float run's values
        (None after a failure, which empties the result)."""
        if not self.pending():
            return None
        try:
            with _quiet_onnxruntime():
                return self._step(list(extra))
        except Exception as exc:  # noqa: BLE001 - the per-tensor view is a diagnostic, not a gate
            self._fail(exc)
            return None

    def _step(self, extra: list[str]) -> dict[str, np.ndarray]:
        i = self.next
        self.next += 1
        feed = self.feeds[i]
        outputs, float_outputs = self.outputs, self.float_outputs
        probe = i < self.n_debug
        q_vals = self.q_probe.run([*outputs, *self.q_fetch] if probe else outputs, feed, reuse=probe)
        self.q_got[i] = {n: q_vals[n] for n in outputs}
        if not probe and not float_outputs and not extra:
            return {}
        if self.f_probe is None:
            self._make_float()
        f_vals = self.f_probe.run([*float_outputs, *extra, *self.f_req] if probe else [*float_outputs, *extra], feed,
                                  reuse=probe)
        if float_outputs:
            self.f_got[i] = {n: f_vals[n] for n in float_outputs}
        if probe:
            dqs = self.dqs
            for name, f, q in self.pairs:
                x = np.asarray(f_vals[f], dtype=np.float32).ravel()
                if q in dqs:
                    d = dqs[q](q_vals[dqs[q].src]).ravel()
                else:
                    d = np.array(q_vals[q], dtype=np.float32).ravel()
                if x.shape != d.shape:
                    continue
                np.subtract(x, d, out=d)  # x - y
                acc = self.sums.setdefault(name, [0.0, 0.0])
                acc[0] += float(np.dot(x, x))  # float32 dot products, as onnxruntime's norms
                acc[1] += float(np.dot(d, d))
            if i == self.n_debug - 1:  # the remaining feeds fetch outputs only
                self.f_probe.release()
                self.q_probe.release()
        return f_vals

    def finish(self) -> _ProbeRuns:
        """Run the feeds not run yet; the result."""
        while self.pending():
            self.step()
        return self.result()

    def result(self) -> _ProbeRuns:
        if not self.ok:
            return _ProbeRuns([], {}, {})
        eps = float(np.finfo("float").eps)
        rows = [{"tensor": k, "sqnr_db": 20 * math.log10(max(math.sqrt(sx), eps) / max(math.sqrt(sd), eps))}
                for k, (sx, sd) in self.sums.items()]
        rows.sort(key=lambda r: r["sqnr_db"])
        return _ProbeRuns(rows[: self.worst], self.q_got, self.f_got)


def _same_feed(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """The same inputs: the same names, and arrays of the same type, shape and values."""
    if set(a) != set(b):
        return False
    for k, v in a.items():
        w = b[k]
        if not (isinstance(v, np.ndarray) and isinstance(w, np.ndarray)) or v.dtype != w.dtype or v.shape != w.shape:
            return False
        if not np.array_equal(v, w):
            return False
    return True


def _match_by_qdq(quant_model: onnx.ModelProto, q_acts: dict, f_acts: dict) -> dict:
    """Activation matching for QDQ models that do not follow onnxruntime's tensor naming: for each
    ``t -> QuantizeLinear -> DequantizeLinear -> t'``, pre = ``t``, post = ``t'``, float = ``t`` of
    the float model."""
    from ..graph import read_graph

    out = {}
    for q in read_graph(quant_model).nodes:
        x = q.inputs[0].name if q.op == "QuantizeLinear" else None
        if x is None or x not in f_acts or x not in q_acts:
            continue
        for dq in q.outputs[0].outputs:
            if dq.op == "DequantizeLinear" and dq.outputs[0].name in q_acts:
                out[x] = {"pre_qdq": q_acts[x], "post_qdq": q_acts[dq.outputs[0].name], "float": f_acts[x]}
                break
    return out
