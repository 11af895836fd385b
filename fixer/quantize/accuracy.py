"""Float vs quantized outputs (cosine, SNR, max abs error) and the tensors with the lowest SQNR
(:func:`accuracy_report`).
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from ..errors import UsageError
from .calibration import _FeedsReader
from .modelproto import _Graph, _clamp_ir, _copy, _quiet_onnxruntime

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
        return {"calibration": self.calibration, "samples": self.samples, "outputs": list(self.outputs),
                "worst_tensors": list(self.worst_tensors)}


def _session(model: onnx.ModelProto):
    from ..verify import session

    return session(model)


def accuracy_report(float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                    feeds: Sequence[Mapping[str, np.ndarray]], *, calibration: str = "random", worst: int = 10,
                    debug_samples: int = 4) -> QuantAccuracy:
    """Compare a quantized model with its float reference on ``feeds``.

    Outputs (matched by name; integer outputs are compared as their values): cosine similarity,
    SNR in dB (``10 log10(sum ref^2 / sum err^2)``, ``inf`` when identical) and max abs error over
    all feeds. ``worst_tensors``: the ``worst`` activations with the lowest SQNR (20 log10 of the
    norm ratio, onnxruntime's ``compute_signal_to_quantization_noice_ratio``) between the float
    model's tensor and the quantized model's dequantized tensor, on the first ``debug_samples``
    feeds (the intermediate tensors of every sample are held in memory).
    """
    if not feeds:
        raise UsageError("the accuracy report needs at least one input sample.")
    s_f, s_q = _session(float_model), _session(quant_model)
    names = [o.name for o in s_f.get_outputs()]
    q_names = {o.name for o in s_q.get_outputs()}
    q_inputs = {i.name for i in s_q.get_inputs()}
    acc: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in names if n in q_names}
    for feed in feeds:
        ref = dict(zip(names, s_f.run(names, dict(feed))))
        got = dict(zip(list(acc), s_q.run(list(acc), {k: v for k, v in feed.items() if k in q_inputs})))
        for n in acc:
            acc[n].append((np.asarray(ref[n]), np.asarray(got[n])))
    outputs = []
    for n in names:
        if n not in acc:
            outputs.append({"name": n, "cosine": None, "snr_db": None, "max_abs_error": None,
                            "detail": "missing from the quantized model"})
            continue
        a = np.concatenate([r.reshape(-1) for r, _ in acc[n]]).astype(np.float64)
        b = np.concatenate([g.reshape(-1) for _, g in acc[n]]).astype(np.float64)
        outputs.append({"name": n, **_compare(a, b)})
    worst_rows = _worst_tensors(float_model, quant_model, list(feeds)[:max(1, debug_samples)], worst) if worst > 0 else []
    return QuantAccuracy(calibration, outputs, worst_rows, len(feeds))


def _compare(a: np.ndarray, b: np.ndarray) -> dict:
    if a.shape != b.shape:
        return {"cosine": 0.0, "snr_db": float("-inf"), "max_abs_error": float("inf"), "detail": "shapes differ"}
    diff = a - b
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    noise = float(np.sum(diff ** 2))
    snr = float("inf") if noise == 0 else float(10 * np.log10(max(float(np.sum(a ** 2)), 1e-30) / noise))
    return {"cosine": cosine, "snr_db": snr, "max_abs_error": float(np.abs(diff).max()) if diff.size else 0.0}


def _worst_tensors(float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                   feeds: list[Mapping[str, np.ndarray]], worst: int) -> list[dict]:
    """The ``worst`` tensors by SQNR of the quantized model's values (DequantizeLinear outputs)
    against the float model's, over all ``feeds``: onnxruntime's ``qdq_loss_debug`` augmented models,
    tensor matching and SQNR (``20 log10(|x| / |x - y|)`` over the samples concatenated), computed
    one sample at a time from running sums, so only one sample's activations are held at once (all
    samples' intermediate tensors of a 640x640 detector took 3.4 GiB)."""
    from onnxruntime.quantization.qdq_loss_debug import (
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )
    from onnxruntime.quantization.qdq_loss_debug import _TENSOR_SAVE_POSTFIX as SAVED

    sums: dict[str, list[float]] = {}  # tensor -> [sum x^2, sum (x - y)^2]
    with tempfile.TemporaryDirectory(prefix="nafix-qdebug-") as tmp:
        fpath, qpath = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        fa, qa = Path(tmp) / "float_aug.onnx", Path(tmp) / "quant_aug.onnx"
        f_model, q_model = _copy(float_model), _copy(quant_model)
        _clamp_ir(f_model)
        _clamp_ir(q_model)
        onnx.save(f_model, str(fpath))
        onnx.save(q_model, str(qpath))
        q_in = {i.name for i in q_model.graph.input}
        del f_model, q_model
        try:
            with _quiet_onnxruntime():
                modify_model_output_intermediate_tensors(str(fpath), str(fa))
                modify_model_output_intermediate_tensors(str(qpath), str(qa))
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                so.log_severity_level = 3
                # every intermediate tensor is an output here: without the arena, each run's
                # buffers go back to the system instead of growing both sessions' pools
                so.enable_cpu_mem_arena = False
                f_sess = ort.InferenceSession(str(fa), so, providers=["CPUExecutionProvider"])
                q_sess = ort.InferenceSession(str(qa), so, providers=["CPUExecutionProvider"])

                # onnxruntime matches tensors by name only: match on the names (each standing for
                # its own values), then fetch just the matched tensors, one sample at a time
                def saved(sess) -> dict[str, list[str]]:
                    return {o.name[: -len(SAVED)]: [o.name] for o in sess.get_outputs() if o.name.endswith(SAVED)}

                f_names, q_names = saved(f_sess), saved(q_sess)
                matching = create_activation_matching(q_names, f_names)
                matching = {k: v for k, v in matching.items() if v.get("float")}
                if not matching:
                    matching = _match_by_qdq(quant_model, q_names, f_names)
                pairs = [(k, v["float"][0], v["post_qdq"][0]) for k, v in matching.items()
                         if v.get("float") and v.get("post_qdq")]
                f_req = sorted({f for _, f, _ in pairs})
                q_req = sorted({q for _, _, q in pairs})
                for feed in feeds if pairs else ():
                    f_vals = dict(zip(f_req, f_sess.run(f_req, feed)))
                    q_vals = dict(zip(q_req, q_sess.run(q_req, {k: v for k, v in feed.items() if k in q_in})))
                    for name, f, q in pairs:
                        x = np.asarray(f_vals[f], dtype=np.float32).ravel()
                        y = np.asarray(q_vals[q], dtype=np.float32).ravel()
                        if x.shape != y.shape:
                            continue
                        d = x - y
                        acc = sums.setdefault(name, [0.0, 0.0])
                        acc[0] += float(np.dot(x, x))  # float32 dot products, as onnxruntime's norms
                        acc[1] += float(np.dot(d, d))
                    del f_vals, q_vals
        except Exception as exc:  # noqa: BLE001 - the per-tensor view is a diagnostic, not a gate
            log.info("per-tensor SQNR unavailable: %s", exc)
            return []
    eps = float(np.finfo("float").eps)
    rows = [{"tensor": k, "sqnr_db": 20 * math.log10(max(math.sqrt(sx), eps) / max(math.sqrt(sd), eps))}
            for k, (sx, sd) in sums.items()]
    rows.sort(key=lambda r: r["sqnr_db"])
    return rows[:worst]


def _match_by_qdq(quant_model: onnx.ModelProto, q_acts: dict, f_acts: dict) -> dict:
    """Activation matching for QDQ models that do not follow onnxruntime's tensor naming: for each
    ``t -> QuantizeLinear -> DequantizeLinear -> t'``, pre = ``t``, post = ``t'``, float = ``t`` of
    the float model."""
    gr = _Graph(quant_model)
    out = {}
    for q in quant_model.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] not in f_acts or q.input[0] not in q_acts:
            continue
        for dq in gr.consumers[q.output[0]]:
            if dq.op_type == "DequantizeLinear" and dq.output[0] in q_acts:
                out[q.input[0]] = {"pre_qdq": q_acts[q.input[0]], "post_qdq": q_acts[dq.output[0]],
                                   "float": f_acts[q.input[0]]}
                break
    return out
