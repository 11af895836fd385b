"""How an output of the fixed model is judged against the original's: the comparisons under a verify
contract (bit-exact, LSB, tolerance, ranking), the figures reported (max abs error, cosine, SNR, bit-exact
fraction), and the quantized graph edges converted to compare them (int8 <-> uint8, dequantized)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnx

from ..rewriters import IoChange
from .contracts import CONTRACT_ORDER, VerifyContract


@dataclass(frozen=True)
class OutputCheck:
    name: str
    ok: bool
    max_abs_error: float
    cosine: float
    snr_db: float
    bit_exact_fraction: float
    within_one_lsb_fraction: float | None
    detail: str
    noise_floor: dict | None = None  # the rewrite's deviation next to rounding noise's, where judged so

    def as_dict(self) -> dict:
        d = {
            "name": self.name, "ok": self.ok, "max_abs_error": self.max_abs_error, "cosine": self.cosine,
            "snr_db": self.snr_db, "bit_exact_fraction": self.bit_exact_fraction,
            "within_one_lsb_fraction": self.within_one_lsb_fraction, "detail": self.detail,
        }
        if self.noise_floor is not None:
            d["noise_floor"] = self.noise_floor
        return d


#: Graph outputs behind a rewrite allowed to differ by a few LSB (bilinear Resize ties): the local
#: difference propagates through later layers, where a sparse output (heatmaps) can move by tens of
#: LSB from a few flipped ties. Such an output is judged against the noise floor (the same model
#: with random +-1 LSB rounding noise at the rewritten nodes); only where no floor can be measured
#: is it held to this cosine. The rewrite itself is held to its contract locally.
PROPAGATED_MIN_COSINE = 0.999


@dataclass(frozen=True)
class BoundaryCheck:
    """A tensor right after a rewritten node (kept by name in both models), judged by that rule's contract."""

    tensor: str
    rule: str
    contract: VerifyContract
    inputs: tuple[str, ...] = ()  # what the rewritten region reads; fed from the original model


def loosest(contracts: Sequence[VerifyContract]) -> VerifyContract:
    """The contract the whole model is held to: the loosest of the rules applied (tolerances max'ed)."""
    if not contracts:
        return VerifyContract("exact")
    worst = max(contracts, key=lambda c: CONTRACT_ORDER[c.contract])
    return VerifyContract(worst.contract, max(c.rtol for c in contracts), max(c.atol for c in contracts),
                          max(c.lsb for c in contracts))


def quantize_like_ort(x: np.ndarray, scale: float, zp: int, dtype: str) -> np.ndarray:
    """QuantizeLinear as onnxruntime computes it: round half to even, saturate."""
    info = np.iinfo(np.dtype(dtype))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # a NaN/zero scale fails the gate, quietly
        q = np.rint(x.astype(np.float32) / np.float32(scale)) + zp
        return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, scale, zp) -> np.ndarray:
    return ((q.astype(np.int32) - np.int32(zp)).astype(np.float32) * np.float32(scale)).astype(np.float32)


def _output_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Scale of the DequantizeLinear that produces each graph output (per-tensor), for LSB checks."""
    outs = {o.name for o in model.graph.output}
    wanted: dict[str, list[str]] = {}  # scale initializer -> the graph outputs it dequantizes
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.output[0] in outs:
            wanted.setdefault(node.input[1], []).append(node.output[0])
    scales = {}
    if not wanted:
        return scales
    found: dict[str, onnx.TensorProto] = {}
    for t in model.graph.initializer:  # (the last of a name, as a dict of them would hold)
        if t.name in wanted:
            found[t.name] = t
    for name, outputs in wanted.items():
        if name in found:
            s = onnx.numpy_helper.to_array(found[name])
            if s.size == 1:
                for o in outputs:
                    scales[o] = float(s.reshape(-1)[0])
    return scales


def compare(a: np.ndarray, b: np.ndarray, contract: VerifyContract, *, lsb_scale: float | None) -> OutputCheck:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return OutputCheck("", False, float("inf"), 0.0, float("-inf"), 0.0, None,
                           f"shape {list(b.shape)} differs from the original {list(a.shape)}")
    if _equal_finite(a, b) and (not lsb_scale or lsb_scale > 0):
        # equal everywhere (most outputs of a bit-exact rewrite): the same figures as below without
        # the float64 copies and the difference arrays (a . b is a . a term by term, summed in the
        # same order, and computed once: the norms and the dot product are the same sum)
        max_abs = 0.0
        aa = _sum_of_squares(a)
        na = nb = float(np.sqrt(aa))
        cosine = float(aa / (na * nb)) if na > 0 else 1.0
        snr = float("inf")
        exact = 1.0
        one_lsb = 1.0 if lsb_scale else None
        a64 = b64 = None  # converted below only where a contract needs them
    elif _one_byte_integers(a, b):
        # int8/uint8 tensors (the rewritten nodes' outputs of a quantized model): the same figures in
        # integers. Every square, product and partial sum is an integer of at most 2**53 in magnitude,
        # so the float64 pairwise sums below are exact: they are the exact integer sums
        diff = np.abs(np.subtract(a, b, dtype=np.int16))
        max_abs = float(diff.max())
        aa = _sum_of_squares(a)
        bb = _sum_of_squares(b)
        na, nb = float(np.sqrt(aa)), float(np.sqrt(bb))
        ab = float(int(np.add.reduce(np.multiply(a.reshape(-1), b.reshape(-1), dtype=np.int32), dtype=np.int64)))
        cosine = float(ab / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
        noise = _sum_of_squares_int16(diff)
        snr = float("inf") if noise == 0 else float(10 * np.log10(max(aa, 1e-30) / noise))
        exact = float(np.mean(diff == 0))
        one_lsb = float(np.mean(diff <= np.float64(lsb_scale * 1.0001))) if lsb_scale else None
        a64 = b64 = None
    else:
        a64 = np.asarray(a, dtype=np.float64)
        b64 = np.asarray(b, dtype=np.float64)
        # the same infinity, or NaN in both, is no difference; the figures below use the finite values
        finite = np.isfinite(a64) & np.isfinite(b64)
        if finite.all():
            # all finite (the usual case): |a - b| is already 0 exactly where a == b, and no value is masked
            diff = np.abs(a64 - b64)
        else:
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.where(same, 0.0, np.abs(a64 - b64))
            a64, b64 = np.where(finite, a64, 0.0), np.where(finite, b64, 0.0)
        max_abs = float(diff.max()) if diff.size else 0.0
        na, nb = _norm(a64), _norm(b64)
        cosine = float(_dot(a64, b64) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
        with np.errstate(invalid="ignore", over="ignore"):
            noise = float(np.sum(diff ** 2))
        snr = float("inf") if noise == 0 else float(10 * np.log10(max(np.sum(a64 ** 2), 1e-30) / noise))
        exact = float(np.mean(diff == 0)) if diff.size else 1.0
        one_lsb = float(np.mean(diff <= lsb_scale * 1.0001)) if lsb_scale else None
    c = contract.contract
    if c == "exact":
        ok = max_abs == 0.0
        detail = "bit-exact" if ok else f"max abs error {max_abs:.3g} (bit-exact required)"
    elif c == "lsb":
        if lsb_scale is None:
            # No quantized output to measure LSBs on: fall back to a relative tolerance.
            rng_ = _value_range(a if a64 is None else a64)
            ok = max_abs <= contract.rtol * rng_ + contract.atol
            detail = f"max abs error {max_abs:.3g} vs allowed {contract.rtol * rng_ + contract.atol:.3g}"
        else:
            allowed = contract.lsb * lsb_scale * 1.0001
            ok = max_abs <= allowed
            detail = f"max abs error {max_abs:.3g} = {max_abs / lsb_scale:.2f} LSB (allowed {contract.lsb:g})"
    elif c == "tolerance":
        rng_ = _value_range(a if a64 is None else a64)
        allowed = contract.rtol * rng_ + contract.atol
        ok = max_abs <= allowed
        detail = f"max abs error {max_abs:.3g} vs allowed {allowed:.3g}"
    else:  # ranking
        if a64 is None:
            a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        ok = _ranking_preserved(a64, b64)
        detail = "argmax and ranking preserved" if ok else "argmax or ranking changed"
    return OutputCheck("", ok, max_abs, cosine, snr, exact, one_lsb, detail)


def _equal_finite(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` (same shape) are not empty, of one dtype, finite and equal everywhere: what
    their float64 copies would be too (a conversion maps equal values to equal values), checked on
    the arrays as they are."""
    if not a.size or a.dtype != b.dtype or a.dtype.kind not in "fiub":
        return False
    if a.dtype.kind == "f" and not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False
    return bool(np.array_equal(a, b))


def _value_range(a: np.ndarray) -> float:
    """max - min of ``a`` in float64 (0 when empty): the extremes converted, then subtracted, as on a
    float64 copy of ``a`` (the conversion keeps the order of values)."""
    if not a.size:
        return 0.0
    return float(np.float64(a.max()) - np.float64(a.min()))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """The dot product of two arrays (any shape and numeric dtype, same size) in float64, by numpy's
    pairwise summation: the same on every machine, and no BLAS call. A multi-threaded BLAS dot sums in
    per-thread chunks (its last digits depend on the thread count) and, on a busy machine, waits for
    its worker threads to wake between onnxruntime runs: up to 50 ms for 30,000 values, the gate's
    largest cost on small models. The product is taken in float64 (``dtype``: each factor converted
    first, as a float64 copy of it would be), so a float32 array needs no float64 copy of its own."""
    return float(np.add.reduce(np.multiply(a.ravel(), b.ravel(), dtype=np.float64)))


def _one_byte(a: np.ndarray) -> bool:
    """``a`` is an int8, uint8 or bool array small enough for sums of squares and products of its
    values to be exact integers in float64 (255**2 per value, 2**53 in all)."""
    return a.dtype.kind in "iub" and a.dtype.itemsize == 1 and a.size * 255 * 255 <= 2 ** 53


def _one_byte_integers(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` are :func:`_one_byte` arrays of one dtype, not empty: :func:`compare`'s
    integer figures are exact for them."""
    return a.dtype == b.dtype and a.size > 0 and _one_byte(a)


def _sum_of_squares_int16(d: np.ndarray) -> float:
    """The sum of the squares of ``d`` (int16 values in 0..255, differences of one-byte values) as
    float64 pairwise summation of them gives it: exactly (see :func:`_sum_of_squares`)."""
    sq = np.square(d.reshape(-1), dtype=np.int32)
    return float(int(np.add.reduce(sq, dtype=np.int64)))


def _sum_of_squares(a: np.ndarray) -> float:
    """``_dot(a, a)``. For a one-byte integer (or bool) array, in integers: the float64 pairwise sum
    of its squares is then exact (every partial sum is an integer of at most 2**53), so it is the
    exact integer sum, which 16-bit squares summed in int64 give without a float64 copy of them (the
    5.5 million values of an int8 tensor over three input sets: 44 MB instead of 130 MB, and 2.5x
    faster). A square of a one-byte value fits 16 bits unsigned (255**2 = 65025)."""
    if _one_byte(a):
        sq = np.square(a.reshape(-1), dtype=np.int16).view(np.uint16)
        return float(int(np.add.reduce(sq, dtype=np.int64)))
    return _dot(a, a)


def _norm(a: np.ndarray) -> float:
    """The Euclidean norm, summed as :func:`_dot` sums."""
    return float(np.sqrt(_dot(a, a)))


def _ranking_preserved(a: np.ndarray, b: np.ndarray) -> bool:
    """argmax equal on every row, and wherever the original strictly decreases along its sorted
    order, the new output does not increase (ties in a saturated softmax may order either way)."""
    if a.ndim == 0:
        return True
    a2 = a.reshape(-1, a.shape[-1])
    b2 = b.reshape(-1, b.shape[-1])
    if not np.array_equal(np.argmax(a2, axis=-1), np.argmax(b2, axis=-1)):
        return False
    for ra, rb in zip(a2, b2):
        order = np.argsort(-ra, kind="stable")
        strict = np.diff(ra[order]) < 0
        if np.any(np.diff(rb[order])[strict] > 0):
            return False
    return True


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` and ``b`` hold the same bits: dtype, shape and every value's bytes (-0.0 is not 0.0,
    and a NaN equals only the same NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind not in "fiub":
        return False
    if a.dtype.kind in "iub":
        return bool(np.array_equal(a, b))
    view = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(np.ascontiguousarray(a).view(view), np.ascontiguousarray(b).view(view)))


def _uint8_to_int8(v: np.ndarray) -> np.ndarray:
    """x - 128 of a uint8 array ``v``, as int8: flipping the top bit subtracts 128 modulo 256, which the
    int8 reading of those bits makes exact (0 -> -128, 128 -> 0, 255 -> 127); one pass, no int16 copy."""
    return np.bitwise_xor(v, np.uint8(0x80)).view(np.int8)


def _int8_to_uint8(g: np.ndarray) -> np.ndarray:
    """y + 128 of an int8 array ``g``, as uint8 (the inverse of :func:`_uint8_to_int8`)."""
    return np.bitwise_xor(g.view(np.uint8), np.uint8(0x80))


def _as_int8_if_shifted(v: np.ndarray, want) -> np.ndarray:
    """An original uint8 tensor where the rewritten model has int8 (NAF014 shifted it by -128)."""
    v = np.asarray(v)
    if v.dtype == np.uint8 and want is np.int8:
        return _uint8_to_int8(v)
    return v


def _edge_in(v: np.ndarray, ch: IoChange) -> np.ndarray:
    """What the application feeds a graph input whose type changed: float quantized with the recorded
    parameters, or a uint8 input shifted to int8 (x - 128)."""
    if ch.was == "uint8" and ch.dtype == "int8":
        v = np.asarray(v)
        return _uint8_to_int8(v) if v.dtype == np.uint8 else (v.astype(np.int16) - 128).astype(np.int8)
    return quantize_like_ort(v, _scalar(ch.scale), _scalar(ch.zero_point), ch.dtype)


def _edge_out(g: np.ndarray, ch: IoChange) -> np.ndarray:
    """A changed graph output brought back to what the original produced: dequantized, or an int8
    output that was uint8 shifted back (y + 128)."""
    if ch.was == "uint8" and ch.dtype == "int8":
        g = np.asarray(g)
        return _int8_to_uint8(g) if g.dtype == np.int8 else (g.astype(np.int16) + 128).astype(np.uint8)
    return dequantize(g, _scalar(ch.scale), _scalar(ch.zero_point))


def _scalar(v) -> float:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError("per-axis edge quantization is not supported by the gate")
    return a.reshape(-1)[0].item()
