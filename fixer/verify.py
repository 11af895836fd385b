"""The equivalence gate: run the original and the rewritten model in onnxruntime on the same inputs
and judge every output under the verify contract of the rules that were applied.

Inputs are seeded random data in each input's dtype and plausible range (for a float input that feeds
a QuantizeLinear, the range its quantization can represent), or the user's ``--inputs file.npz``.
Where a rule changed the model's interface (int8 graph edges), the fixed model is fed the quantized
input and its int8 output is dequantized with the recorded scale and zero-point before comparison.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from .errors import InputError
from .model_io import read_npz
from .runtime import prepare_for_runtime, serialized_sessions, session_as_written
from .randomdata import uniform
from .rewriters import IoChange
from .rules import CONTRACT_ORDER, VerifyContract

NP_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
}


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


@dataclass
class Verification:
    ok: bool
    contract: VerifyContract
    rules: list[str]
    outputs: list[OutputCheck] = field(default_factory=list)
    inputs: str = "random"
    samples: int = 0
    boundaries: list[OutputCheck] = field(default_factory=list)
    propagated: bool = False

    def as_dict(self) -> dict:
        text = self.contract.describe()
        if self.propagated:
            text = (f"{text} at each rewritten node; graph outputs, where those differences propagate "
                    f"through later layers: within the deviation random +-1 LSB rounding noise at the rewritten "
                    f"nodes causes ({NOISE_MEAN_FACTOR:g}x its mean + {NOISE_STD_MARGIN:g} std)")
        return {
            "ok": self.ok, "contract": self.contract.contract, "contract_text": text,
            "rules": self.rules, "inputs": self.inputs, "samples": self.samples,
            "outputs": [o.as_dict() for o in self.outputs],
            "rewritten_nodes": [o.as_dict() for o in self.boundaries],
        }


def loosest(contracts: Sequence[VerifyContract]) -> VerifyContract:
    """The contract the whole model is held to: the loosest of the rules applied (tolerances max'ed)."""
    if not contracts:
        return VerifyContract("exact")
    worst = max(contracts, key=lambda c: CONTRACT_ORDER[c.contract])
    return VerifyContract(worst.contract, max(c.rtol for c in contracts), max(c.atol for c in contracts),
                          max(c.lsb for c in contracts))


def session(model: onnx.ModelProto):
    """An onnxruntime session of ``model`` as written (no graph optimization); a large graph is made
    and run as consecutive segments, the same values (:mod:`fixer.segments`)."""
    return begin_session(model).ready()


class _Whole:
    """A whole-graph session not made yet: :meth:`ready` makes it (see :func:`begin_session`)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model

    def ready(self):
        return session_as_written(self.model)


class _Pooled:
    """A whole-graph session being made by the shared segment threads."""

    def __init__(self, future):
        self.future = future

    def ready(self):
        return self.future.result()


def begin_session(model: onnx.ModelProto, *, keep: bool = True, extra: Sequence[str] = (),
                  names: Callable[[], tuple[list[list[str]], list[list[str]]]] | None = None):
    """:func:`session` of ``model`` with ``extra`` as outputs too (:func:`_with_outputs`), begun:
    ``.ready()`` returns the session or raises onnxruntime's error. A large graph's segments are
    written now and handed to the segment threads, which make their sessions while the caller goes
    on (:class:`fixer.segments.SegmentedSession`; the model is not copied to add ``extra``); any
    other graph's session is handed to the threads the caller shares
    (:func:`fixer.segments.shared_workers`, the gate's), or else made by ``.ready()``. With ``keep``
    False, a large graph's segment sessions are dropped once made (:class:`fixer.segments.Loaded`:
    they answer what they loaded as; running the graph makes them again), for a model that is mostly
    only checked to load. ``names()``: each node's input and output names (``node.input[:]``,
    ``node.output[:]``), where the caller has them (:func:`fixer.segments.plan`)."""
    from . import segments

    cut = segments.plan(model, extra=extra, names=names)
    if cut is not None:
        try:
            return segments.SegmentedSession(model, cut, session_as_written, keep=keep, extra=extra,
                                             make_serialized=serialized_sessions(model.ir_version))
        except segments.Unsegmentable:
            pass
    model = _with_outputs(model, extra)
    pool = segments.current_workers()
    if pool is not None:
        return _Pooled(pool.submit(session_as_written, model))
    return _Whole(model)


def _begin_fixed(fixed: onnx.ModelProto, extra: Sequence[str], keep: bool = True, names=None):
    """The fixed model's session with ``extra`` as outputs, begun (:func:`begin_session`, ``keep``
    and ``names`` as there; in the gate, handed to its shared threads after the original's); a graph whose
    segments are made in order and one of them rejected gives what raises that error when waited for."""
    try:
        return begin_session(fixed, keep=keep, extra=extra, names=names)
    except Exception as exc:  # noqa: BLE001 - a segment made in order was rejected: the gate's verdict
        return _Failed(exc)


def _fixed_session(begun) -> tuple[object | None, str]:
    """The session ``begun`` (:func:`_begin_fixed`), or (None, the first line of onnxruntime's
    error): a rewrite that onnxruntime rejects fails the gate, not nafix."""
    try:
        return begun.ready(), ""
    except Exception as exc:  # noqa: BLE001
        return None, str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


class _Failed:
    """A session that could not be begun: :meth:`ready` raises its error."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def ready(self):
        raise self.exc


def _input_range(model: onnx.ModelProto, name: str) -> tuple[float, float] | None:
    """The float range a QuantizeLinear right after input ``name`` can represent (None when its
    parameters are not a usable per-tensor scale: missing, NaN, infinite, zero, float zero-point).

    The first QuantizeLinear reading ``name`` is found first (a QDQ model's is near the top), then
    its scale and zero-point: the last initializer of that name, else the last Constant node making
    it (no name table of the whole graph: 0.040 -> 0.007 s on a 31k-node chain)."""
    g = model.graph
    node = next((n for n in g.node if n.op_type == "QuantizeLinear" and n.input and n.input[0] == name), None)
    if node is None:
        return None
    ins = node.input[:]
    wanted = {t for t in ins[1:3] if t}
    tensors = {t.name: t for t in g.initializer if t.name in wanted}
    if len(tensors) < len(wanted):
        consts = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output and n.output[0] in wanted}
    else:
        consts = {}

    def val(t):
        try:
            if t in tensors:
                return onnx.numpy_helper.to_array(tensors[t])
            if t in consts and consts[t].attribute:
                return onnx.numpy_helper.to_array(consts[t].attribute[0].t)
        except Exception:  # noqa: BLE001 - an odd constant just gives no range
            return None
        return None

    s = val(ins[1]) if len(ins) > 1 else None
    z = val(ins[2]) if len(ins) > 2 and ins[2] else np.zeros((), np.uint8)
    return _quantized_range(s, z)


def _quantized_range(s: np.ndarray | None, z: np.ndarray | None) -> tuple[float, float] | None:
    """The float range a per-tensor scale ``s`` and integer zero-point ``z`` can represent (None when
    either is missing or not usable)."""
    if s is None or z is None or np.size(s) != 1 or np.size(z) != 1 or z.dtype.kind not in "iu":
        return None
    scale = float(np.asarray(s, dtype=np.float64).reshape(-1)[0])
    if not np.isfinite(scale) or scale <= 0:
        return None
    info = np.iinfo(z.dtype)
    lo = (info.min - float(z.reshape(-1)[0])) * scale
    hi = (info.max - float(z.reshape(-1)[0])) * scale
    if not (np.isfinite(lo) and np.isfinite(hi) and hi - lo < 1e30):
        return None
    return lo, hi


def _dynamic_dims(sess) -> list[str]:
    """'input' axis N ('sym') for every graph input dimension onnxruntime sees as dynamic."""
    return [f"'{i.name}' axis {k} ('{d}')" if isinstance(d, str) else f"'{i.name}' axis {k}"
            for i in sess.get_inputs() for k, d in enumerate(i.shape or ()) if not (isinstance(d, int) and d > 0)]


def _input_dtype(i) -> type:
    """The numpy type of an onnxruntime graph input, or an InputError for what the gate cannot feed."""
    dtype = NP_TYPES.get(i.type)
    if dtype is None:
        kind = "a sequence" if i.type.startswith("seq(") else ("a map" if i.type.startswith("map(") else
                                                                ("optional" if i.type.startswith("optional(") else i.type))
        raise InputError(f"graph input '{i.name}' is {kind} ({i.type}); nafix's equivalence gate feeds only numeric "
                         "tensors, so it cannot fix this model (audit works).")
    return dtype


def original_failed(exc: Exception, sess=None, *, what: str = "the equivalence gate") -> InputError:
    """The error for an original model that onnxruntime rejects or cannot run on the gate's inputs:
    one sentence naming the cause, and --input-shape where a dynamic dimension was guessed."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:300]
    dyn = _dynamic_dims(sess) if sess is not None else []
    if dyn:
        return InputError(f"onnxruntime cannot run the original model with its dynamic dimension(s) {', '.join(dyn)} "
                          f"set to 1 for {what} ({first}); pin them with --input-shape NAME=d0,d1,... (the shape the "
                          "application uses).")
    return InputError(f"onnxruntime cannot run the original model, which {what} needs ({first}).")


def make_inputs(model: onnx.ModelProto, *, seed: int = 0, samples: int = 3, sess=None) -> list[dict[str, np.ndarray]]:
    """Seeded random inputs for every graph input, in its dtype and plausible range (``sess``: an
    onnxruntime session of ``model`` to read the inputs from, instead of a new one)."""
    if sess is None:
        try:
            sess = session(model)
        except Exception as exc:  # noqa: BLE001 - onnxruntime rejects the original: say so, once
            raise original_failed(exc) from None
    rng = np.random.default_rng(seed)
    declared = {vi.name: vi for vi in model.graph.input}
    ranges: dict[str, tuple[float, float] | None] = {}  # per input name, read from the model once
    out = []
    for _ in range(samples):
        feed = {}
        for i in sess.get_inputs():
            if i.type.startswith("seq(tensor(") and i.name in declared:
                # a sequence of tensors: two random elements of the declared element shape
                elem = declared[i.name].type.sequence_type.elem_type.tensor_type
                shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in elem.shape.dim]
                kind = i.type[len("seq("):-1]
                feed[i.name] = [_random_tensor(rng, model, i.name, kind, shape, ranges) for _ in range(2)]
                continue
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
            feed[i.name] = _random_tensor(rng, model, i.name, _input_dtype(i), shape, ranges)
        out.append(feed)
    return out


def _random_tensor(rng, model: onnx.ModelProto, name: str, dtype, shape: list[int],
                   ranges: dict | None = None) -> np.ndarray:
    """Seeded random values of ``dtype`` (a numpy type or an onnxruntime type string) in a plausible range
    (``ranges``: :func:`_input_range` by input name, filled as they are read)."""
    if isinstance(dtype, str):
        if dtype not in NP_TYPES:
            raise InputError(f"graph input '{name}' holds {dtype} elements; nafix's equivalence gate feeds only "
                             "numeric tensors, so it cannot fix this model (audit works).")
        dtype = NP_TYPES[dtype]
    if np.dtype(dtype).kind == "f":
        if ranges is None:
            ranges = {}
        if name not in ranges:
            ranges[name] = _input_range(model, name)
        rng_ = ranges[name] or (-1.0, 1.0)
        return uniform(rng, rng_[0], rng_[1], shape, dtype)
    if dtype is np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -128), min(info.max, 255)
    if dtype is np.int64 or dtype is np.int32:
        lo, hi = 0, 3
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def load_inputs_npz(path: str | Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Inputs from an .npz whose arrays are keyed by input name (a leading sample axis is optional).

    Never unpickles: an array of Python objects is refused with what is expected instead."""
    p = Path(path)
    data = read_npz(p, "--inputs")
    try:
        sess = session(model)
    except Exception as exc:  # noqa: BLE001
        raise original_failed(exc) from None
    batches = _check_npz_inputs(p, data, [(i.name, i.type, i.shape) for i in sess.get_inputs()])
    feeds: list[dict[str, np.ndarray]] = []
    for name, (dtype, batch) in batches.items():
        for k, a in enumerate(batch):
            if len(feeds) <= k:
                feeds.append({})
            feeds[k][name] = np.asarray(a).astype(dtype)
    return feeds


def check_inputs_npz(path: str | Path, model: onnx.ModelProto) -> None:
    """Check the user's ``--inputs`` .npz against ``model``'s graph inputs (names, types and shapes as
    the model declares them), before any work: one :class:`InputError` sentence naming the file and
    the problem (not an .npz, pickled objects, an array that is no input, a missing input, a shape or
    a dtype the input cannot take)."""
    p = Path(path)
    data = read_npz(p, "--inputs")
    inits = {t.name for t in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
        shape = None
        if tt is not None and tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        inputs.append((vi.name, _type_text(vi.type), shape))
    _check_npz_inputs(p, data, inputs)


def _type_text(tp: onnx.TypeProto) -> str:
    """A type as onnxruntime writes it (``tensor(float)``, ``seq(tensor(float))``)."""
    def elem(code: int) -> str:
        try:
            return onnx.TensorProto.DataType.Name(code).lower()
        except ValueError:
            return str(code)

    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({elem(tp.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({elem(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({elem(tp.map_type.key_type)},{_type_text(tp.map_type.value_type)})"
    return "of no declared type"


def _check_npz_inputs(p: Path, data: Mapping[str, np.ndarray], inputs: Sequence[tuple[str, str, Sequence | None]]
                      ) -> dict[str, tuple[object, list[np.ndarray]]]:
    """The samples of each input (``inputs``: name, onnxruntime type text, shape or None), checked:
    every array is an input's, every input has one, of its rank (a leading sample axis allowed), its
    static dimensions and a dtype it can take; the same number of samples for every input."""
    out: dict[str, tuple[object, list[np.ndarray]]] = {}
    for name, type_text, shape in inputs:
        if name not in data:
            raise InputError(f"{p}: has no array named '{name}' (it has {', '.join(data) or 'none'}); --inputs "
                             "needs one array per graph input, keyed by the input name.")
        arr = data[name]
        if type_text not in NP_TYPES:
            raise InputError(f"{p}: input '{name}' is {type_text}; an .npz can only give numeric tensors: leave "
                             "--inputs out (the gate then makes random inputs of every type it can).")
        dtype = NP_TYPES[type_text]
        if shape is None:  # (no declared rank: the array is one sample)
            batch = [arr]
        else:
            rank = len(shape)
            if arr.ndim not in (rank, rank + 1):
                raise InputError(f"{p}: array '{name}' has shape {tuple(arr.shape)}, but input '{name}' has rank "
                                 f"{rank} (shape {_shape_text(shape)}; a leading sample axis is allowed).")
            batch = [arr] if arr.ndim == rank else list(arr)
            if not batch:
                raise InputError(f"{p}: array '{name}' holds no sample (its leading axis is 0).")
            want = [d if isinstance(d, int) and d > 0 else None for d in shape]
            got = tuple(batch[0].shape)
            if any(w is not None and w != g for w, g in zip(want, got)):
                raise InputError(f"{p}: array '{name}' has samples of shape {got}, but input '{name}' expects "
                                 f"{_shape_text(shape)}.")
        problem = _dtype_problem(arr, np.dtype(dtype))
        if problem:
            raise InputError(f"{p}: array '{name}' ({arr.dtype}) cannot be input '{name}' "
                             f"({np.dtype(dtype).name}): {problem}.")
        out[name] = (dtype, batch)
    names = [name for name, _, _ in inputs]
    for key in data:
        if key not in names:
            raise InputError(f"{p}: array '{key}' is not a graph input of the model (its inputs: "
                             f"{', '.join(names) or 'none'}); --inputs needs one array per graph input, keyed by the "
                             "input name.")
    counts = {len(b) for _, b in out.values()}
    if len(counts) > 1:
        raise InputError(f"{p}: the arrays hold different numbers of samples; give every input the same count.")
    return out


def _dtype_problem(arr: np.ndarray, want: np.dtype) -> str | None:
    """Why the values of ``arr`` cannot be given as ``want`` without changing them (None: they can).
    Any number goes to a float input; an integer or bool input takes whole numbers in its range."""
    if want.kind == "f" or arr.size == 0:
        return None
    if arr.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            if not np.all(np.isfinite(arr)):
                return "it holds NaN or infinite values"
            if not np.all(arr == np.round(arr)):
                return "it holds fractional values"
    lo, hi = (0, 1) if want.kind == "b" else (np.iinfo(want).min, np.iinfo(want).max)
    if arr.dtype.kind != "b" and (arr.min() < lo or arr.max() > hi):
        return f"its values span {arr.min()}..{arr.max()}, outside {lo}..{hi}"
    return None


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in shape or ()) + ")"


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


def _sharing_segment_workers(func):
    """``func`` run with :func:`fixer.segments.shared_workers`: the segment sessions it begins (large
    graphs) are made by threads it shares between its models and ends before it returns."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from .segments import shared_workers

        with shared_workers():
            return func(*args, **kwargs)

    return wrapper


@_sharing_segment_workers
def verify(
    original: onnx.ModelProto,
    fixed: onnx.ModelProto,
    *,
    contract: VerifyContract,
    rules: Sequence[str] = (),
    io_changes: Sequence[IoChange] = (),
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    seed: int = 0,
    samples: int = 3,
    boundaries: Sequence[BoundaryCheck] = (),
    original_run: Callable[[Mapping[str, np.ndarray], list[str]], list | None] | None = None,
) -> Verification:
    """Run both models on the same inputs; every output must satisfy ``contract``, and every
    boundary tensor its rule's contract. When a contract allows LSB differences at a rewritten node
    (``lsb`` > 0), a graph output downstream that differs is judged against the noise floor: the
    original model run with random +-1 LSB rounding noise injected at the rewritten nodes' outputs,
    at the rate the rewrite differs there (:func:`noise_floor`); both figures are reported.

    onnxruntime sessions: one for the original model (graph outputs, boundary tensors and the
    tensors the rewritten regions read, all in one run), one for the fixed model with all the
    isolated rewritten regions (:class:`_WholeRun`; apart where they do not join it), and one for the
    noise-injected original when it is needed (a graph of :data:`fixer.segments.SEGMENT_FROM` nodes
    or more: one session per segment of it, made by threads the gate shares between the two models,
    the same values; :func:`begin_session`). Where :func:`fixed_part` applies, the fixed model's
    session only proves it loads: what runs is the part below what is provably equal to the original
    (:func:`proven_equal`), fed the original's values there, with the isolated regions in that same
    session; its outputs are those of the whole fixed model, bit for bit (onnxruntime computes each
    node from its inputs alone). Before the part (or the whole fixed model), where
    :func:`rewritten_part` applies, the rewritten nodes alone run on the original's values (one more
    small session): on an input set where they compute the original's values bit for bit, every
    tensor of the fixed model is the original's, and nothing else of the fixed model runs on it; the
    fixed model's session is then its own (the regions join it only from the first input set the
    rewritten nodes do not prove), and where they prove every input set, so do the isolated regions,
    which do not run apart either.

    ``original_run(feed, names)``: the original model's values of ``names`` on ``feed`` (a list in
    that order) from a run made elsewhere, by onnxruntime without graph optimizations (the same
    kernels on the same inputs: the same bits), or None, and the gate's own session runs it (the
    accuracy report of --quantize runs the original on the gate's seeded inputs)."""
    src = "npz" if inputs is not None else "random"
    orig_names = {o.name for o in original.graph.output}
    facts = _Facts(original, fixed)
    both = facts.o_made & facts.f_made
    boundaries = [b for b in boundaries if b.tensor in both and b.tensor not in orig_names]
    extra = sorted({b.tensor for b in boundaries})
    known = facts.o_made | {i.name for i in original.graph.input}
    capture = sorted({t for b in boundaries if b.inputs for t in b.inputs if t in known} - set(extra) - orig_names)
    # a noise floor may be measured (an LSB-tolerant rewrite under an LSB contract): the original's
    # run also keeps the tensors the part of the model below the rewritten nodes reads, so the noisy
    # runs evaluate that part alone (the layers above them compute the same values on every draw)
    noisy = sorted({b.tensor for b in boundaries if b.contract.contract == "lsb" and b.contract.lsb > 0})
    cut = _downstream(original, noisy) if noisy and contract.contract == "lsb" else None
    if cut is not None:
        capture = sorted(set(capture) | (set(cut.inputs) - set(extra) - orig_names - {i.name for i in original.graph.input}))
    in_changes = {c.name: c for c in io_changes if c.kind == "input"}
    out_changes = {c.name: c for c in io_changes if c.kind == "output"}
    # the fixed model runs only below what is provably equal to the original (fed the original's
    # values there, which its run then also fetches); the whole fixed model still loads in a session
    wanted = [o.name for o in original.graph.output if o.name not in extra] + extra
    proof = proven_equal(original, fixed, in_changes, facts=facts)
    fpart = fixed_part(original, fixed, in_changes, wanted, proof=proof, facts=facts)
    # the part's frontier: fetched only where the part runs
    front = [] if fpart is None else sorted(set(fpart.frontier) - set(extra) - orig_names - set(capture))
    # before the part, the rewritten nodes alone (:func:`rewritten_part`): where they compute the
    # original's values on an input set, so does the whole fixed model, and neither the part nor the
    # whole fixed model runs on it (the original's run fetches what they read and compute)
    rpart = rewritten_part(original, fixed, proof, wanted, bool(in_changes or out_changes),
                           fpart.part.model.graph.node if fpart is not None else None, facts=facts)
    o_inputs = {i.name for i in original.graph.input}
    rcap = ([] if rpart is None else
            sorted((set(rpart.part.inputs) | set(rpart.checked)) - set(extra) - set(capture) - orig_names - o_inputs))
    # the sessions are begun, then waited for: the gate's shared threads make the original's first,
    # then, where the gate will use it (no whole-model run with the regions), the fixed model's,
    # while the gate goes on (onnxruntime releases the GIL while it loads and plans a model; a large
    # graph's segments are each such a session)
    early = None
    try:
        o_begun = begin_session(original, extra=extra + capture + sorted(set(front) | set(rcap)),
                                names=facts.o.names)
    except Exception as exc:  # noqa: BLE001 - onnxruntime rejects the original: an input problem, said once
        raise original_failed(exc) from None
    # where the rewritten nodes apart or the part below what is proven equal may run in its place,
    # the fixed model's session may only prove that it loads: a large graph's segment sessions are
    # then dropped once made (made again if it runs after all), so the gate does not hold both
    # models' sessions (the 31k-node QDQ chain's fix peaked at 876 MiB instead of 1,138)
    keep_fixed = rpart is None and fpart is None
    if rpart is not None or not (fpart is None and any(b.inputs for b in boundaries)):
        early = _begin_fixed(fixed, extra, keep_fixed, facts.f.names)
    try:
        s_orig = o_begun.ready()
    except Exception as exc:  # noqa: BLE001 - onnxruntime rejects the original: an input problem, said once
        if early is not None:
            _fixed_session(early)  # no session left loading behind the error
        raise original_failed(exc) from None
    feeds = list(inputs) if inputs is not None else make_inputs(original, seed=seed, samples=samples, sess=s_orig)
    fetched = set(extra) | set(capture) | set(front) | set(rcap)
    names = [o.name for o in s_orig.get_outputs() if o.name not in fetched]
    # no part: the whole fixed model runs, with the isolated rewritten regions in its session (which
    # loads only where the fixed model does); they read what each input set's captured values hold.
    # Where the rewritten nodes may prove every input set, that session waits for the first set they
    # do not prove (the fixed model loads on its own meanwhile, its loadability checked)
    def build_whole():
        if fpart is None and feeds and any(b.inputs for b in boundaries):
            return _WholeRun.build(fixed, boundaries, extra, set(feeds[0]) | set(names) | set(extra) | set(capture),
                                   in_changes)
        return None

    whole = build_whole() if rpart is None else None

    def load_fixed():
        nonlocal early
        sess, first = _fixed_session(early if early is not None
                                     else _begin_fixed(fixed, extra, keep_fixed, facts.f.names))
        early = None
        if sess is not None:
            return sess, None
        check = OutputCheck("<model>", False, float("inf"), 0.0, float("-inf"), 0.0, None,
                            f"the rewritten model does not load in onnxruntime: {first}")
        return None, Verification(False, contract, list(rules), [check], src, len(feeds))

    s_fix = None
    fixed_inputs: set[str] = set()

    def fixed_ready() -> Verification | None:
        """Wait for the fixed model's session (or the whole run's): the failed verdict where it does
        not load or lacks an output the original has, else None."""
        nonlocal s_fix, fixed_inputs
        if whole is not None:
            s_fix = whole.sess
        else:
            s_fix, failed = load_fixed()
            if failed is not None:
                return failed
        fixed_names = {o.name for o in s_fix.get_outputs()}
        missing = [n for n in names if n not in fixed_names]
        if missing:
            checks = [OutputCheck(n, False, float("inf"), 0.0, float("-inf"), 0.0, None,
                                  "output missing from the fixed model") for n in missing]
            return Verification(False, contract, list(rules), checks, src, len(feeds))
        fixed_inputs = {i.name for i in s_fix.get_inputs()}
        return None

    # with the rewritten nodes apart, the fixed model is waited for only where an input set needs it
    # or at the end (its verdict is the same then): a large graph's segments go on loading in the
    # shared threads while the original runs and the rewritten nodes are checked
    if rpart is None and (failed := fixed_ready()) is not None:
        return failed
    lsb = _output_scales(original)
    acc: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in names + extra}
    captured: list[dict[str, np.ndarray]] = []
    prun = _PartRun(fpart, fixed, boundaries, in_changes, names + extra) if fpart is not None else None
    rrun = _RewrittenRun(rpart) if rpart is not None else None
    rproven = False  # the rewritten nodes computed the original's values on an input set already
    part_runs = 0  # input sets the part ran on (its isolated regions count only if it ran on all)
    kept = names + extra + capture

    def run_original(feed, more):
        ref = original_run(feed, kept + more) if original_run is not None else None
        if ref is not None:
            return ref, {**dict(feed), **dict(zip(kept + more, ref))}
        try:
            ref = s_orig.run(kept + more, dict(feed))
        except Exception as exc:  # noqa: BLE001 - e.g. a dynamic dimension the gate had to guess
            raise original_failed(exc, s_orig) from None
        return ref, {**dict(feed), **dict(zip(kept + more, ref))}

    for feed in feeds:
        # the frontier only where the part may run on this input set: with the rewritten nodes'
        # tensors until they computed the original's values once (an input set they get wrong
        # after that runs the original again, for the frontier)
        if rrun is None:
            more = list(front)
        else:
            more = list(rcap) + ([] if rproven else [t for t in front if t not in rcap])
        try:
            ref, vals = run_original(feed, more)
        except Exception:
            if s_fix is None and (failed := fixed_ready()) is not None:
                return failed  # (as when the fixed model was waited for before any run)
            raise
        if rrun is not None:
            try:
                proven = rrun.proven(vals)
            except Exception:  # noqa: BLE001 - the rewritten nodes do not run on their own
                proven = False
            if proven:
                # every tensor of the fixed model is the original's on this input set
                rproven = True
                captured.append({k: vals[k] for k in list(feed) + kept})
                for n, r in zip(names + extra, ref):
                    acc[n].append((np.asarray(r), np.asarray(r)))
                continue
            rrun = None  # they differ here: the part (or the whole model) runs from this input set on
            if s_fix is None and (failed := fixed_ready()) is not None:
                return failed
            if any(t not in vals for t in front):
                ref, vals = run_original(feed, list(front))
            whole = build_whole()
            if whole is not None:
                s_fix = whole.sess
        captured.append({k: vals[k] for k in list(feed) + kept + front})
        ffeed = {}
        for k, v in feed.items():
            if k not in fixed_inputs:
                continue
            ch = in_changes.get(k)
            ffeed[k] = _edge_in(v, ch) if ch else v
        got = None
        if prun is not None:
            try:
                got = prun.run(ffeed, captured[-1])
                part_runs += 1
            except Exception:  # noqa: BLE001 - the part does not run on its own: the whole model runs
                prun = None
        if got is None and whole is not None:
            try:
                got = whole.run(names + extra, ffeed, captured[-1])
            except Exception:  # noqa: BLE001 - maybe a region: the fixed model alone from here on, the regions apart
                whole = None
                s_fix, failed = load_fixed()
                if failed is not None:
                    return failed
        try:
            if got is None:
                got = s_fix.run(names + extra, ffeed)
        except Exception as exc:  # noqa: BLE001 - a rewrite onnxruntime cannot run fails the gate, not nafix
            first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:300]
            check = OutputCheck("<model>", False, float("inf"), 0.0, float("-inf"), 0.0, None,
                                f"the rewritten model fails in onnxruntime: {first}")
            return Verification(False, contract, list(rules), [check], src, len(feeds))
        for n, r, g in zip(names + extra, ref, got):
            ch = out_changes.get(n)
            if ch is not None:
                g = _edge_out(g, ch)
            elif n in extra:
                r = _as_int8_if_shifted(r, np.asarray(g).dtype.type)
            acc[n].append((np.asarray(r), np.asarray(g)))

    if s_fix is None and (failed := fixed_ready()) is not None:
        return failed  # the rewritten nodes proved every input set: the fixed model must still load

    def flat(n):
        a = np.concatenate([r.reshape(-1) for r, _ in acc[n]]) if acc[n] else np.zeros(0)
        b = np.concatenate([g.reshape(-1) for _, g in acc[n]]) if acc[n] else np.zeros(0)
        return a, b

    bchecks = []
    rates: dict[str, float] = {}  # boundary tensor -> fraction of values the rewrite changed there
    isolated = prun.isolated() if prun is not None and part_runs == len(feeds) else None
    if isolated is None and whole is not None and whole.runs == len(feeds):
        isolated = whole.isolated()
    if isolated is None and rrun is not None and feeds:
        # the rewritten nodes computed the original's values on every input set: so does every
        # isolated region (its nodes fed the original's values), the figures of the tensors themselves
        isolated = {}
    if isolated is None:
        isolated = _isolated_boundaries(fixed, boundaries, captured, in_changes)
    for bc in boundaries:
        a, b = isolated.get(bc.tensor) or flat(bc.tensor)
        integer = a.dtype.kind in "iu"
        chk = compare(a, b, bc.contract, lsb_scale=1.0 if integer else None)
        bchecks.append(OutputCheck(f"{bc.tensor} ({bc.rule})", chk.ok, chk.max_abs_error, chk.cosine, chk.snr_db,
                                   chk.bit_exact_fraction, chk.within_one_lsb_fraction, chk.detail))
        if integer and bc.contract.contract == "lsb" and bc.contract.lsb > 0:
            rates[bc.tensor] = max(rates.get(bc.tensor, 0.0), 1.0 - chk.bit_exact_fraction)
    propagated = any(b.contract.contract == "lsb" and b.contract.lsb > 0 for b in boundaries)
    checks = []
    pending = []
    for n in names:
        a, b = flat(n)
        if contract.contract == "ranking":
            a = np.stack([r for r, _ in acc[n]])
            b = np.stack([g for _, g in acc[n]])
        scale = lsb.get(n) or (_scalar(out_changes[n].scale) if n in out_changes else None)
        chk = compare(a, b, contract, lsb_scale=scale)
        checks.append(OutputCheck(n, chk.ok, chk.max_abs_error, chk.cosine, chk.snr_db, chk.bit_exact_fraction,
                                  chk.within_one_lsb_fraction, chk.detail))
        if propagated and not chk.ok and contract.contract == "lsb":
            pending.append((len(checks) - 1, n, scale))
    if pending:
        floor = None
        if any(r > 0 for r in rates.values()):
            try:
                floor = noise_floor(original, {t: r for t, r in rates.items() if r > 0}, feeds,
                                    {n: [r for r, _ in acc[n]] for _, n, _ in pending},
                                    {t: captured[0][t] for t in rates}, seed=seed,
                                    below=(cut, captured) if cut is not None else None)
            except Exception:  # noqa: BLE001 - e.g. a model onnxruntime cannot run with the injection
                floor = None
        for i, n, scale in pending:
            old = checks[i]
            dev = output_deviation([r for r, _ in acc[n]], [g for _, g in acc[n]], scale)
            if floor is not None and n in floor:
                ok, text = judge_against_floor(dev, floor[n])
                detail = f"{old.detail}; differences from the rewritten nodes propagate here: {text}"
                nf = {"rewrite": dev.as_dict(), "floor": floor[n].as_dict(), "accepted": ok}
            else:
                ok = old.cosine >= PROPAGATED_MIN_COSINE
                detail = (f"{old.detail}; differences from the rewritten nodes propagate here: cosine {old.cosine:.6f} "
                          f"({'accepted' if ok else 'rejected'}: no noise floor could be measured, needs cosine >= "
                          f"{PROPAGATED_MIN_COSINE})")
                nf = None
            checks[i] = OutputCheck(n, ok, old.max_abs_error, old.cosine, old.snr_db, old.bit_exact_fraction,
                                    old.within_one_lsb_fraction, detail, nf)
    ok = all(c.ok for c in checks) and all(c.ok for c in bchecks)
    return Verification(ok, contract, list(rules), checks, src, len(feeds), bchecks, propagated)


# ------------------------------------------------------------------------------------------------
# the noise floor: how much the graph outputs move when only rounding changes at the rewritten nodes
# ------------------------------------------------------------------------------------------------

#: Draws of the random +-1 LSB noise per input set when measuring the floor.
NOISE_DRAWS = 8
#: A rewrite is accepted when each deviation is at most the floor's mean times this factor plus
#: NOISE_STD_MARGIN standard deviations of the floor (and rejected beyond).
NOISE_MEAN_FACTOR = 1.5
NOISE_STD_MARGIN = 3.0


@dataclass(frozen=True)
class Deviation:
    """How far outputs moved from the original's: 1 - cosine, max abs difference (in LSB where the
    output is quantized), and the fraction of argmax positions (per heatmap channel, or per row of a
    classifier) that changed."""

    cosine: float
    max_lsb: float
    argmax_changed: float | None
    unit: str = "LSB"

    def as_dict(self) -> dict:
        return {"cosine": self.cosine, "max_diff": self.max_lsb, "unit": self.unit,
                "argmax_changed": self.argmax_changed}


@dataclass(frozen=True)
class NoiseFloor:
    """The deviations rounding noise alone causes (one per draw) and the rate it was injected at."""

    draws: tuple[Deviation, ...]
    rates: Mapping[str, float]

    def stat(self, what: str) -> tuple[float, float]:
        v = np.array([getattr(d, what) for d in self.draws], dtype=np.float64)
        return float(v.mean()), float(v.std())

    def as_dict(self) -> dict:
        cm, cs = self.stat("cosine")
        out = {"cosine_mean": cm, "cosine_std": cs, "draws": len(self.draws),
               "max_diff_range": [min(d.max_lsb for d in self.draws), max(d.max_lsb for d in self.draws)],
               "unit": self.draws[0].unit, "injected_rates": dict(self.rates)}
        if self.draws[0].argmax_changed is not None:
            am, ast = self.stat("argmax_changed")
            out.update({"argmax_changed_mean": am, "argmax_changed_std": ast})
        return out


def _argmax_rows(x: np.ndarray) -> np.ndarray | None:
    """Argmax per heatmap channel (rank 4: over the spatial positions, channel axis guessed as the
    smallest of axes 1 and 3) or per row of a classifier (rank 2-3: over the last axis)."""
    if x.ndim == 4:
        if x.shape[3] < x.shape[1] and x.shape[3] < x.shape[2]:  # NHWC
            x = np.moveaxis(x, 3, 1)
        return x.reshape(x.shape[0] * x.shape[1], -1).argmax(axis=1)
    if x.ndim in (2, 3) and x.shape[-1] > 1:
        return x.reshape(-1, x.shape[-1]).argmax(axis=1)
    return None


def output_deviation(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], scale: float | None) -> Deviation:
    a = np.concatenate([np.asarray(r, np.float64).reshape(-1) for r in ref])
    b = np.concatenate([np.asarray(g, np.float64).reshape(-1) for g in got])
    na, nb = _norm(a), _norm(b)
    cos = float(_dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    changed = None
    rows = [(_argmax_rows(np.asarray(r)), _argmax_rows(np.asarray(g))) for r, g in zip(ref, got)]
    if rows and all(x is not None for x, _ in rows):
        total = sum(x.size for x, _ in rows)
        changed = float(sum(int(np.sum(x != y)) for x, y in rows) / max(total, 1))
    return Deviation(cos, diff / scale if scale else diff, changed, "LSB" if scale else "abs")


def judge_against_floor(dev: Deviation, floor: NoiseFloor) -> tuple[bool, str]:
    """Accept when every deviation of the rewrite (1 - cosine, max difference, argmax changes) is
    within NOISE_MEAN_FACTOR x the floor's mean + NOISE_STD_MARGIN x its standard deviation."""
    verdicts = []
    d_m, d_s = floor.stat("cosine")
    lim_cos = 1.0 - (NOISE_MEAN_FACTOR * (1.0 - d_m) + NOISE_STD_MARGIN * d_s)
    verdicts.append(dev.cosine >= lim_cos - 1e-12)
    m_m, m_s = floor.stat("max_lsb")
    lim_max = NOISE_MEAN_FACTOR * m_m + NOISE_STD_MARGIN * m_s
    verdicts.append(dev.max_lsb <= lim_max + 1e-9)
    arg = ""
    if dev.argmax_changed is not None and floor.draws[0].argmax_changed is not None:
        a_m, a_s = floor.stat("argmax_changed")
        lim_arg = NOISE_MEAN_FACTOR * a_m + NOISE_STD_MARGIN * a_s
        verdicts.append(dev.argmax_changed <= lim_arg + 1e-12)
        arg = (f", argmax changed on {dev.argmax_changed:.1%}", f", argmax changed on {a_m:.1%} +- {a_s:.1%}")
    ok = all(verdicts)
    unit = dev.unit
    lo = min(d.max_lsb for d in floor.draws)
    hi = max(d.max_lsb for d in floor.draws)
    rate = max(floor.rates.values())
    text = (f"rewrite: cosine {dev.cosine:.4f}, max {dev.max_lsb:.3g} {unit}{arg[0] if arg else ''}; "
            f"rounding noise alone (+-1 LSB at up to {rate:.2%} of the rewritten nodes' outputs, "
            f"{len(floor.draws)} draws): cosine {d_m:.4f} +- {d_s:.4f}, max {lo:.3g}-{hi:.3g} {unit}"
            f"{arg[1] if arg else ''} ({'accepted' if ok else 'rejected'}: each figure must stay within "
            f"{NOISE_MEAN_FACTOR:g}x the noise mean + {NOISE_STD_MARGIN:g} std)")
    return ok, text


def noise_floor(original: onnx.ModelProto, rates: Mapping[str, float], feeds: Sequence[Mapping[str, np.ndarray]],
                refs: Mapping[str, list[np.ndarray]], examples: Mapping[str, np.ndarray], *, seed: int = 0,
                draws: int = NOISE_DRAWS, below: tuple | None = None) -> dict[str, NoiseFloor]:
    """Run the ORIGINAL model with random +-1 LSB noise added to each tensor of ``rates`` (integer
    tensors right after rewritten nodes) at that rate, ``draws`` times over ``feeds``, and measure how
    far the outputs ``refs`` move: the deviation rounding differences alone cause. One session.

    ``below``: (the :class:`Downstream` part of the original below a set of tensors that holds every
    tensor of ``rates``, the original's values per feed of every tensor that part reads). The noise
    changes nothing above the noisy tensors, so only that part runs on each draw, fed the original's
    values (the same values the whole model computes there: the floor is the same)."""
    names = list(refs)
    per_draw = None
    if below is not None:
        part, values = below
        inside = [n for n in names if n in part.produced]
        if (set(rates) <= set(part.tensors) and len(values) == len(feeds)
                and all(t in v for v in values for t in part.inputs)):
            try:
                per_draw = _noisy_draws(part.typed([values[0][t] for t in part.inputs], inside), rates,
                                        [{t: v[t] for t in part.inputs} for v in values], inside, examples, seed, draws)
            except Exception:  # noqa: BLE001 - the part does not run on its own: the whole model runs
                per_draw = None
            if per_draw is not None:
                # an output no noisy tensor reaches: the original's own values, which every draw computes
                for outs in per_draw:
                    outs.update({n: list(refs[n]) for n in names if n not in inside})
    if per_draw is None:
        per_draw = _noisy_draws(original, rates, feeds, names, examples, seed, draws)
    scales = _output_scales(original)
    out = {}
    for n in names:
        devs = tuple(output_deviation(refs[n], d[n], scales.get(n)) for d in per_draw)
        out[n] = NoiseFloor(devs, dict(rates))
    return out


@dataclass(frozen=True)
class Downstream:
    """The part of a model below some of its tensors: every node that reads them, directly or not,
    as a model of its own whose graph inputs are the tensors that part reads from above (``inputs``)."""

    model: onnx.ModelProto
    tensors: tuple[str, ...]  # the tensors it is below
    inputs: tuple[str, ...]  # what it reads from the rest of the model (graph inputs included)
    produced: frozenset[str]  # the tensors it computes

    def typed(self, examples: Sequence[np.ndarray], outputs: Sequence[str]) -> onnx.ModelProto:
        """The part with its graph inputs declared, typed like ``examples`` (one value per input), and
        ``outputs`` as its graph outputs."""
        from onnx import helper

        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs)
        m.graph.input.extend(helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
                             for t, v in zip(self.inputs, examples))
        if m.ir_version < 4:  # before IR 4 every initializer is also a graph input
            m.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                 for t in m.graph.initializer)
        return m


def _downstream(model: onnx.ModelProto, tensors: Sequence[str]) -> Downstream | None:
    """The :class:`Downstream` part of ``model`` below ``tensors`` (None where a node there holds a
    subgraph, which may read outer tensors by name: the whole model runs instead)."""
    reached = set(tensors)
    part = []
    for node in model.graph.node:  # topologically sorted (ONNX requires it)
        if any(i in reached for i in node.input if i):
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                return None
            part.append(node)
            reached.update(o for o in node.output if o)
    if not part:
        return None
    return _part(model, part, tensors)


def _part(model: onnx.ModelProto, part: Sequence[onnx.NodeProto], tensors: Sequence[str],
          inits: Mapping[str, onnx.TensorProto] | None = None) -> Downstream:
    """``part`` (nodes of ``model``, in its order) as a :class:`Downstream` model of its own: the
    initializers it reads kept, every other tensor it reads from the rest of the model an input
    (``inits``: ``model``'s initializers by name, the last of a name, where the caller has them)."""
    produced = {o for n in part for o in n.output if o}
    if inits is None:
        inits = {t.name: t for t in model.graph.initializer}
    read: dict[str, None] = {}  # in first-read order (a dict: a list's membership test is linear)
    for n in part:
        for i in n.input:
            if i and i not in produced:
                read.setdefault(i)
    inputs = tuple(i for i in read if i not in inits)
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    m.graph.name = model.graph.name
    m.graph.node.extend(part)
    m.graph.initializer.extend(inits[i] for i in read if i in inits)
    return Downstream(m, tuple(tensors), inputs, frozenset(produced))


def _subgraphs(model: onnx.ModelProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for n in model.graph.node for a in n.attribute)


def proven_equal(original: onnx.ModelProto, fixed: onnx.ModelProto, in_changes: Mapping[str, IoChange], *,
                 facts: _Facts | None = None) -> tuple[set[str], list[onnx.NodeProto]] | None:
    """The tensors of ``fixed`` that are provably equal to ``original``'s tensor of the same name
    when both models run on the same feed, and the nodes of ``fixed`` that are not proven (in the
    fixed model's order), in one topological pass. A tensor is proven when it is an initializer
    with the same bytes in both, a graph input declared alike in both whose interface no rule
    changed (not in ``in_changes``: both get the same feed), or an output of a node identical to the
    original's node of that output (op, domain, attributes, input and output names) whose inputs are
    all proven: onnxruntime computes a node from its inputs alone. None where the proof does not
    apply: subgraphs (If/Loop/Scan read outer tensors by name), different opsets or local functions,
    a name both graph input and initializer (a feed may override it). ``facts``: the gate's
    :class:`_Facts` of these models, where the caller has them."""
    if _subgraphs(original) or _subgraphs(fixed):
        return None
    opsets = [{(o.domain or "ai.onnx"): o.version for o in m.opset_import} for m in (original, fixed)]
    if opsets[0] != opsets[1]:
        return None
    if [f.SerializeToString() for f in original.functions] != [f.SerializeToString() for f in fixed.functions]:
        return None
    facts = facts or _Facts(original, fixed)
    o_inits = {t.name: t for t in original.graph.initializer}
    f_inits = facts.f_inits
    o_inputs = {vi.name: vi for vi in original.graph.input}
    f_inputs = {vi.name: vi for vi in fixed.graph.input}
    if set(o_inits) & set(o_inputs) or set(f_inits) & set(f_inputs):
        return None
    same: set[str] = set()
    for name, t in f_inits.items():
        if name in o_inits and o_inits[name].SerializeToString() == t.SerializeToString():
            same.add(name)
    for name, vi in f_inputs.items():
        if (name in o_inputs and name not in in_changes
                and o_inputs[name].type.SerializeToString() == vi.type.SerializeToString()):
            same.add(name)
    producer = facts.o.producer
    rest = []
    alike: set[int] = set()  # ids of the nodes of ``rest`` that are the original's node (:func:`_same_node`)
    for n, ins, outs in zip(facts.f.nodes, facts.f.reads, facts.f.writes):
        first = outs[0] if outs and outs[0] else next((o for o in outs if o), None)
        m = producer.get(first) if first is not None else None
        if m is not None and _same_node(m, n, ins, outs):
            if all(i in same for i in ins if i):
                same.update(o for o in outs if o)
                continue
            alike.add(id(n))
        rest.append(n)
    facts.alike = (rest, alike)
    return same, rest


#: The gate runs a part of the fixed model only when it holds at most this fraction of its nodes:
#: above, its own session costs about what the runs it saves do (the values are the same either way).
PART_MAX_FRACTION = 0.5


@dataclass(frozen=True)
class FixedPart:
    """What of the fixed model the gate runs: its unproven nodes (:func:`proven_equal`) as a model
    whose inputs are proven tensors (fed the original's values, ``frontier`` those the original's run
    must fetch) or the fixed model's graph inputs; every other wanted tensor is the original's."""

    part: Downstream
    same: frozenset[str]
    frontier: tuple[str, ...]
    graph_inputs: frozenset[str]


_UNSET = object()


def fixed_part(original: onnx.ModelProto, fixed: onnx.ModelProto, in_changes: Mapping[str, IoChange],
               wanted: Sequence[str], *, proof=_UNSET, facts: _Facts | None = None) -> FixedPart | None:
    """The :class:`FixedPart` that yields ``wanted`` tensors of ``fixed`` as running the whole fixed
    model would, or None where the whole model is to run (no proof, nothing proven, a part of more
    than half the nodes, a wanted tensor neither proven nor computed by the part). ``proof``: what
    :func:`proven_equal` returns for these models, where the caller has it; ``facts``: their
    :class:`_Facts`, likewise."""
    facts = facts or _Facts(original, fixed)
    if proof is _UNSET:
        proof = proven_equal(original, fixed, in_changes, facts=facts)
    if proof is None:
        return None
    same, rest = proof
    nodes = facts.f.nodes
    if not rest or len(rest) == len(nodes):
        return None
    keep = _with_constant_inputs(rest, same, facts.f_const, facts.f.producer)
    if len(keep) > PART_MAX_FRACTION * len(nodes) or len(keep) == len(nodes):
        return None
    part = _part(fixed, [n for n in nodes if id(n) in keep], (), facts.f_inits)
    f_inputs = frozenset(vi.name for vi in fixed.graph.input)
    if any(n not in same and n not in part.produced for n in wanted):
        return None
    if any(t not in same and t not in f_inputs for t in part.inputs):
        return None
    frontier = tuple(t for t in part.inputs if t not in f_inputs)
    return FixedPart(part, frozenset(same), frontier, f_inputs)


def _computed_from_initializers(model: onnx.ModelProto, reads: list[list[str]] | None = None,
                                writes: list[list[str]] | None = None) -> set[str]:
    """The initializers of ``model`` and the tensors computed from initializers alone (``reads`` and
    ``writes``: its nodes' input and output names, where the caller has them)."""
    const = {t.name for t in model.graph.initializer}
    if reads is None or writes is None:
        nodes = list(model.graph.node)
        reads, writes = [n.input[:] for n in nodes], [n.output[:] for n in nodes]
    for ins, outs in zip(reads, writes):  # topologically sorted
        if all(i in const for i in ins if i):
            const.update(o for o in outs if o)
    return const


def _with_constant_inputs(nodes: Sequence[onnx.NodeProto], same: set[str], const: set[str],
                          producer: Mapping[str, onnx.NodeProto]) -> set[int]:
    """The ids of ``nodes`` and of the nodes computing, from initializers alone, a proven tensor they
    read (e.g. a weight's DequantizeLinear): a part computes such a tensor again, by the same nodes
    from the same bytes, rather than having it fetched from the original's run and fed (fetching
    keeps every such tensor of the original's run apart, and copies it). ``const``:
    :func:`_computed_from_initializers` of the fixed model, ``producer``: its nodes by output."""
    keep = {id(n) for n in nodes}
    todo = [i for n in nodes for i in n.input if i and i in same and i in producer and i in const]
    while todo:
        n = producer[todo.pop()]
        if id(n) not in keep:
            keep.add(id(n))
            todo.extend(i for i in n.input if i and i in producer)
    return keep


#: The gate tries :func:`rewritten_part` only where the fixed model's nodes that differ from the
#: original's are at most this fraction of the nodes it runs otherwise (the part, or the whole fixed
#: model): else running them alone saves little.
REWRITTEN_MAX_FRACTION = 0.5
#: The ops where a model's time goes, for that comparison.
HEAVY_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MatMul", "MatMulInteger",
                       "QLinearMatMul", "Gemm", "LSTM", "GRU", "RNN", "Attention"})


@dataclass(frozen=True)
class RewrittenPart:
    """The nodes of the fixed model that differ from the original's (:func:`rewritten_part`), as a
    model fed the original's values of what they read; ``checked``: the tensors they compute that
    the rest of the fixed model or the gate reads (every one also a tensor of the original)."""

    part: Downstream
    checked: tuple[str, ...]


def _same_node(m: onnx.NodeProto | None, n: onnx.NodeProto, inputs: list[str] | None = None,
               outputs: list[str] | None = None) -> bool:
    """``n`` is ``m``: op, domain, attributes, input and output names (not what the inputs hold);
    ``inputs``, ``outputs``: ``n``'s input and output names, where the caller has read them."""
    return (m is not None and m.op_type == n.op_type and m.domain == n.domain
            and m.input[:] == (n.input[:] if inputs is None else inputs)
            and m.output[:] == (n.output[:] if outputs is None else outputs)
            and [a.SerializeToString() for a in m.attribute] == [a.SerializeToString() for a in n.attribute])


def rewritten_part(original: onnx.ModelProto, fixed: onnx.ModelProto, proof, wanted: Sequence[str],
                   io_changed: bool = False, replaces: Sequence[onnx.NodeProto] | None = None, *,
                   facts: _Facts | None = None) -> RewrittenPart | None:
    """The fixed model's unproven nodes (``proof`` from :func:`proven_equal`) that are not the
    original's node of the same output (or that read a fixed-model initializer or graph input not
    proven equal): the rewritten nodes. Fed the original's values of what they read, they compute the
    ``checked`` tensors; where each of those equals the original's tensor bit for bit on an input
    set, every tensor of the fixed model equals the original's of the same name on it: by induction
    in topological order, any other node is the original's node, and reads proven tensors, checked
    tensors or tensors of such nodes (onnxruntime computes a node from its inputs alone). The gate
    then needs the original's values only. None where that induction cannot be set up: no proof, a
    changed graph interface (``io_changed``), nothing rewritten, too many rewritten nodes, a tensor
    they read or a checked or ``wanted`` tensor that is not the original's. Too many: more than
    REWRITTEN_MAX_FRACTION of the nodes the gate runs otherwise (``replaces``: the part's, default the
    whole fixed model's), counting nodes that compute from more than initializers, and counting
    convolutions and matrix products alone (where most of the time goes). ``facts``: the gate's
    :class:`_Facts` of these models, where the caller has them."""
    if proof is None or io_changed:
        return None
    same, rest = proof
    facts = facts or _Facts(original, fixed)
    producer = facts.o.producer
    f_made = facts.f_made
    # (the nodes :func:`proven_equal` found to be the original's node, where it recorded them)
    known = facts.alike[1] if facts.alike is not None and facts.alike[0] is rest else None
    diff = [n for n in rest if not ((id(n) in known if known is not None else
                                     _same_node(producer.get(next((o for o in n.output if o), "")), n))
                                    and all(i in same or i in f_made for i in n.input if i))]
    nodes, reads, writes = facts.f.nodes, facts.f.reads, facts.f.writes
    heavy = lambda nodes: sum(1 for n in nodes if n.op_type in HEAVY_OPS)  # noqa: E731
    runs = nodes if replaces is None else list(replaces)
    if not diff or heavy(diff) > REWRITTEN_MAX_FRACTION * heavy(runs):
        return None
    const = facts.f_const
    # (the nodes whose input names ``names`` lists that compute from more than initializers)
    computing = lambda names: sum(1 for ins in names if any(i not in const for i in ins if i))  # noqa: E731
    if (computing([n.input[:] for n in diff])
            > REWRITTEN_MAX_FRACTION * computing(reads if replaces is None else [n.input[:] for n in runs])):
        return None
    ids = {id(n) for n in diff}
    # a tensor of the rewritten nodes that only QuantizeLinear nodes read (a QDQ model's Conv output):
    # those join them, and the quantized values are what is compared (float values that round alike
    # are no difference to the rest of the model)
    readers: dict[str, list] = {}
    for n, ins in zip(nodes, reads):
        for i in ins:
            if i:
                readers.setdefault(i, []).append(n)
    for n in list(diff):
        for o in n.output:
            rs = readers.get(o, [])
            if (o and rs and o not in wanted and all(r.op_type == "QuantizeLinear" and r.domain in ("", "ai.onnx")
                                                   and r.input[0] == o and o not in r.input[1:] for r in rs)):
                for r in rs:
                    if id(r) not in ids:
                        diff.append(r)
                        ids.add(id(r))
    keep = _with_constant_inputs(diff + _dequantized_reads(diff, ids, producer, same, const, facts.f.producer),
                                 same, const, facts.f.producer)
    part = _part(fixed, [n for n in nodes if id(n) in keep], (), facts.f_inits)
    o_made = facts.o_made
    o_inputs = {vi.name for vi in original.graph.input}
    # what the rewritten nodes read from the rest: proven graph inputs, or tensors of nodes that are
    # the original's (proven by the induction); either way the original computes them by that name
    if any(not ((t in same and t in o_inputs) or (t in f_made and t in o_made)) for t in part.inputs):
        return None
    outside = {i for n, ins in zip(nodes, reads) if id(n) not in ids for i in ins if i} | set(wanted)
    checked = tuple(o for n, outs in zip(nodes, writes) if id(n) in ids for o in outs if o and o in outside)
    if not checked or any(t not in o_made for t in checked):
        return None
    if any(t not in same and t not in f_made for t in wanted):
        return None
    return RewrittenPart(part, checked)


def _dequantized_reads(diff: Sequence[onnx.NodeProto], ids: set[int],
                       producer: Mapping[str, onnx.NodeProto], same: set[str], const: set[str],
                       f_producer: Mapping[str, onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The DequantizeLinear nodes of the fixed model (``f_producer``: its nodes by output) whose float
    activation the rewritten nodes ``diff`` (ids ``ids``) read, where such a node is the original's
    node of that tensor (``producer``: the original's nodes by output) with a proven scale and zero-point (in ``same``), and reads a tensor
    that a node computes in both models, no rewritten node among them, and not from initializers
    alone (``const``: those are :func:`_with_constant_inputs`'). In the rewritten nodes' part such a node computes the
    original's value of its output again, bit for bit (the same node on the original's int8 values
    and the same parameters; onnxruntime computes a node from its inputs alone): the part then reads
    the int8 tensor, and the original's run fetches that rather than the float one (onnxruntime's
    session costs grow faster than the graph with float activations fetched as outputs)."""
    made_by_diff = {o for n in diff for o in n.output if o}
    out: list[onnx.NodeProto] = []
    taken: set[int] = set()
    for n in diff:
        for i in n.input:
            d = f_producer.get(i) if i and i not in const else None
            if (d is None or id(d) in ids or id(d) in taken or d.op_type != "DequantizeLinear"
                    or d.domain not in ("", "ai.onnx") or not d.input or not _same_node(producer.get(i), d)):
                continue
            x = d.input[0]  # computed by a node in both models (a graph input stays the part's float input)
            if (not x or x not in f_producer or x not in producer or x in made_by_diff or x in const
                    or any(j and j not in same for j in d.input[1:])):
                continue
            taken.add(id(d))
            out.append(d)
    return out


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


#: The rewritten nodes' part runs in sessions of about this many nodes at most, each holding whole
#: regions (nodes that share a tensor other than an initializer stay together): onnxruntime's session
#: costs more per node the larger the graph (the 31k-node QDQ chain's part, 5,704 nodes in 713
#: regions: 0.36 s in one session, 0.15 s in ten). A part of this size or smaller: one session.
REWRITTEN_GROUP_NODES = 600


def _region_groups(part: Downstream, limit: int) -> list[list[int]] | None:
    """The nodes of ``part`` (their indices, in its order) in groups of whole regions, a group closed
    before it would pass ``limit`` nodes (a region larger than that is a group of its own); None
    where that makes one group."""
    nodes = part.model.graph.node
    if len(nodes) <= limit:
        return None
    inits = {t.name for t in part.model.graph.initializer}
    parent = list(range(len(nodes)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    first: dict[str, int] = {}  # tensor -> the first node that reads or computes it
    for k, n in enumerate(nodes):
        for t in itertools.chain(n.input, n.output):
            if t and t not in inits:
                a, b = root(first.setdefault(t, k)), root(k)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    regions: dict[int, list[int]] = {}  # by root, in the order of each region's first node
    for k in range(len(nodes)):
        regions.setdefault(root(k), []).append(k)
    groups: list[list[int]] = []
    cur: list[int] = []
    for members in regions.values():
        if cur and len(cur) + len(members) > limit:
            groups.append(sorted(cur))
            cur = []
        cur.extend(members)
    if cur:
        groups.append(sorted(cur))
    return groups if len(groups) > 1 else None


class _RewrittenRun:
    """The gate's runs of the rewritten nodes alone (:class:`RewrittenPart`), one input set at a time:
    sessions made on the first input set (the part's inputs typed by their values), one per group
    of whole regions (:func:`_region_groups`), or one for the whole part. Each node computes from
    its inputs alone, so the groups compute what the part's one session does."""

    def __init__(self, rp: RewrittenPart, group_nodes: int | None = None):
        self.rp = rp
        self.group_nodes = REWRITTEN_GROUP_NODES if group_nodes is None else group_nodes
        self.sess: list[tuple] | None = None  # (session, its inputs, its outputs) per group

    def _sessions(self, feed: Mapping[str, np.ndarray]) -> list[tuple]:
        part, checked = self.rp.part, list(self.rp.checked)
        groups = _region_groups(part, self.group_nodes)
        subs = []
        if groups is not None:
            nodes = part.model.graph.node
            for g in groups:
                sub = _part(part.model, [nodes[k] for k in g], ())
                outs = [t for t in checked if t in sub.produced]
                if not outs or any(t not in feed for t in sub.inputs):
                    subs = []  # a group computing nothing checked: the part runs whole
                    break
                subs.append((sub, outs))
        if not subs:
            subs = [(part, checked)]
        begun = [begin_session(sub.typed([feed[t] for t in sub.inputs], outs)) for sub, outs in subs]
        return [(b.ready(), sub.inputs, outs) for b, (sub, outs) in zip(begun, subs)]

    def proven(self, vals: Mapping[str, np.ndarray]) -> bool:
        """Whether every checked tensor computed from ``vals`` (the original's values of this input
        set) is the original's, bit for bit: then the fixed model computes the original's values."""
        feed = {t: vals[t] for t in self.rp.part.inputs}
        if self.sess is None:
            self.sess = self._sessions(feed)
        got: dict[str, np.ndarray] = {}
        for sess, inputs, outs in self.sess:
            got.update(zip(outs, sess.run(outs, {t: feed[t] for t in inputs})))
        return all(_same_bits(vals[t], got[t]) for t in self.rp.checked)


#: The suffix of the isolated rewritten regions' tensor names where they share the part's session.
REGION = "__nafix_region"


class _PartRun:
    """The gate's runs of the fixed model below what is proven (:class:`FixedPart`), one input set at
    a time, with the isolated rewritten regions (:func:`_isolated_boundaries`, their tensors renamed)
    in the same session: one session for both, made on the first input set (the part's inputs typed
    by their values). A proven name is the original's value."""

    def __init__(self, fp: FixedPart, fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck],
                 in_changes: Mapping[str, IoChange], names: Sequence[str]):
        self.fp, self.fixed, self.boundaries, self.in_changes = fp, fixed, list(boundaries), in_changes
        self.names = list(names)
        self.outs = [n for n in names if n not in fp.same]
        self.sess = None
        self.tensors: list[str] = []  # boundary tensors of the regions run in the part's session
        self.need: dict[str, type] = {}  # region input -> the dtype the region wants
        self.regions: dict[str, tuple[list, list]] = {}
        self.regions_ok = False  # the regions ran in this session on every input set so far

    def _build(self, feed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> None:
        m = self.fp.part.typed([feed[t] for t in self.fp.part.inputs], self.outs)
        region = _region_model(self.fixed, self.boundaries, vals)
        if region is not None:
            try:
                sess = session(_merged(m, _renamed(region[0], REGION)))
                need = {i.name[:-len(REGION)]: NP_TYPES.get(i.type) for i in sess.get_inputs() if i.name.endswith(REGION)}
                if all(n in vals for n in need):
                    self.sess, self.tensors, self.need, self.regions_ok = sess, region[1], need, True
                    self.regions = {t: ([], []) for t in self.tensors}
                    return
            except Exception:  # noqa: BLE001 - the regions do not join the part: they run on their own
                pass
        self.sess = session(m)

    def run(self, ffeed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        feed = {t: ffeed[t] if t in self.fp.graph_inputs else vals[t] for t in self.fp.part.inputs}
        if self.sess is None:
            self._build(feed, vals)
        if self.regions_ok:
            rfeed = {n: _as_int8_if_shifted(vals[n], w) for n, w in self.need.items()}
            if any(k in self.in_changes for k in rfeed):
                rfeed = {k: _edge_in(v, self.in_changes[k]) if k in self.in_changes else v for k, v in rfeed.items()}
            try:
                res = self.sess.run(self.outs + [t + REGION for t in self.tensors],
                                    {**feed, **{k + REGION: v for k, v in rfeed.items()}})
            except Exception:  # noqa: BLE001 - maybe a region alone: the part runs on its own, the regions apart
                self.regions_ok, self.sess = False, None
                self.sess = session(self.fp.part.typed([feed[t] for t in self.fp.part.inputs], self.outs))
                return self.run(ffeed, vals)
            for t, g in zip(self.tensors, res[len(self.outs):]):
                g = np.asarray(g)
                self.regions[t][0].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
                self.regions[t][1].append(g.reshape(-1))
            res = res[:len(self.outs)]
        else:
            res = self.sess.run(self.outs, feed)
        got = dict(zip(self.outs, res))
        return [got[n] if n in got else vals[n] for n in self.names]

    def isolated(self) -> dict | None:
        """What :func:`_isolated_boundaries` returns, from this session's runs (None: not run here)."""
        if not self.regions_ok:
            return None
        return {t: (np.concatenate(r), np.concatenate(g)) for t, (r, g) in self.regions.items()}


class _WholeRun:
    """The gate's runs of the whole fixed model (where no :class:`FixedPart` applies) with the isolated
    rewritten regions (:func:`_isolated_boundaries`, their tensors renamed) in the same session, as
    :class:`_PartRun` has them in the part's: one session for both, which loads only where the fixed
    model does (the regions' tensors are apart from its own)."""

    def __init__(self, sess, tensors: list[str], need: dict[str, type], in_changes: Mapping[str, IoChange]):
        self.sess, self.tensors, self.need, self.in_changes = sess, tensors, need, in_changes
        self.regions: dict[str, tuple[list, list]] = {t: ([], []) for t in tensors}
        self.runs = 0  # input sets run so far

    @classmethod
    def build(cls, fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck], extra: Sequence[str],
              keys: set[str], in_changes: Mapping[str, IoChange]) -> "_WholeRun | None":
        """The session, or None where the regions do not join the fixed model (``keys``: the names
        each input set's captured values hold, as :func:`_isolated_boundaries` reads them)."""
        region = _region_model(fixed, boundaries, dict.fromkeys(keys))
        if region is None:
            return None
        own = (_tensor_names(fixed) | {vi.name for vi in fixed.graph.input} | {vi.name for vi in fixed.graph.output}
               | {t.name for t in fixed.graph.initializer})
        if any(n.endswith(REGION) for n in own):
            return None
        try:
            sess = session(_merged(_with_outputs(fixed, extra), _renamed(region[0], REGION)))
        except Exception:  # noqa: BLE001 - the fixed model loads on its own (or fails the gate) and the regions apart
            return None
        need = {i.name[:-len(REGION)]: NP_TYPES.get(i.type) for i in sess.get_inputs() if i.name.endswith(REGION)}
        if not all(n in keys for n in need):
            return None
        return cls(sess, region[1], need, in_changes)

    def run(self, outs: list[str], ffeed: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> list:
        """``outs`` of the fixed model on ``ffeed``; the regions on ``vals`` (the original's values)."""
        rfeed = {n: _as_int8_if_shifted(vals[n], w) for n, w in self.need.items()}
        if any(k in self.in_changes for k in rfeed):
            rfeed = {k: _edge_in(v, self.in_changes[k]) if k in self.in_changes else v for k, v in rfeed.items()}
        res = self.sess.run(outs + [t + REGION for t in self.tensors],
                            {**ffeed, **{k + REGION: v for k, v in rfeed.items()}})
        for t, g in zip(self.tensors, res[len(outs):]):
            g = np.asarray(g)
            self.regions[t][0].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
            self.regions[t][1].append(g.reshape(-1))
        self.runs += 1
        return res[:len(outs)]

    def isolated(self) -> dict:
        return {t: (np.concatenate(r), np.concatenate(g)) for t, (r, g) in self.regions.items()}


def _renamed(model: onnx.ModelProto, suffix: str) -> onnx.ModelProto:
    """``model`` with every tensor and node name suffixed (no subgraphs: the part has none)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    ren = (lambda x: x + suffix if x else x)
    for n in m.graph.node:
        ins, outs = [ren(i) for i in n.input], [ren(o) for o in n.output]
        del n.input[:]
        n.input.extend(ins)
        del n.output[:]
        n.output.extend(outs)
        n.name = ren(n.name)
    for t in m.graph.initializer:
        t.name = ren(t.name)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        vi.name = ren(vi.name)
    return m


def _merged(a: onnx.ModelProto, b: onnx.ModelProto) -> onnx.ModelProto:
    """One model of two with disjoint names (``a``'s header)."""
    m = onnx.ModelProto()
    m.CopyFrom(a)
    for f in ("node", "initializer", "input", "output", "value_info"):
        getattr(m.graph, f).extend(getattr(b.graph, f))
    return m


def _noisy_draws(model: onnx.ModelProto, rates: Mapping[str, float], feeds: Sequence[Mapping[str, np.ndarray]],
                 names: Sequence[str], examples: Mapping[str, np.ndarray], seed: int, draws: int) -> list[dict]:
    """``names`` of ``model`` with the noise of :func:`noise_floor` injected, per draw and feed (one session)."""
    model, noise_inputs = _with_noise(model, {t: np.asarray(examples[t]).dtype for t in rates})
    sess = session(model) if names else None
    shapes = {t: list(np.asarray(examples[t]).shape) for t in rates}
    rng = np.random.default_rng([seed, 7])
    per_draw: list[dict[str, list[np.ndarray]]] = []
    for _ in range(draws):
        outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feed in feeds:
            f = dict(feed)
            for t, inp in noise_inputs.items():
                flip = rng.random(shapes[t]) < rates[t]
                sign = np.where(rng.random(shapes[t]) < 0.5, -1.0, 1.0)
                f[inp] = (flip * sign).astype(np.float32)
            if sess is not None:
                for n, v in zip(names, sess.run(list(names), f)):
                    outs[n].append(np.asarray(v))
        per_draw.append(outs)
    return per_draw


def _with_noise(model: onnx.ModelProto, tensors: Mapping[str, np.dtype]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with each integer tensor ``t`` of ``tensors`` replaced, for its readers, by
    clip(t + noise_t, type range), ``noise_t`` a new float graph input; returns (model, {t: input})."""
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs: dict[str, str] = {}
    new_nodes = []
    for k, (t, dt) in enumerate(tensors.items()):
        info = np.iinfo(dt)
        to = helper.np_dtype_to_tensor_dtype(dt)
        noisy, inp = f"{t}__nafix_noisy", f"{t}__nafix_noise"
        for node in m.graph.node:
            for i, x in enumerate(node.input):
                if x == t:
                    node.input[i] = noisy
        lo, hi = f"{t}__nafix_lo", f"{t}__nafix_hi"
        m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(info.min, np.float32), lo),
                                    onnx.numpy_helper.from_array(np.array(info.max, np.float32), hi)])
        new_nodes += [
            helper.make_node("Cast", [t], [f"{t}__nafix_f"], name=f"{t}__nafix_cast", to=TensorProto.FLOAT),
            helper.make_node("Add", [f"{t}__nafix_f", inp], [f"{t}__nafix_sum"], name=f"{t}__nafix_add"),
            helper.make_node("Clip", [f"{t}__nafix_sum", lo, hi], [f"{t}__nafix_clip"], name=f"{t}__nafix_clip"),
            helper.make_node("Cast", [f"{t}__nafix_clip"], [noisy], name=f"{t}__nafix_back", to=to),
        ]
        m.graph.input.append(helper.make_tensor_value_info(inp, TensorProto.FLOAT, None))
        inputs[t] = inp
    # the injection reads each tensor right after its producer: append, then sort topologically
    nodes = list(m.graph.node) + new_nodes
    del m.graph.node[:]
    m.graph.node.extend(_toposort(nodes, {i.name for i in m.graph.input} | {t.name for t in m.graph.initializer}))
    return m, inputs


def _toposort(nodes, available: set[str]) -> list:
    avail = set(available) | {""}
    out, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in avail for i in n.input):
                out.append(n)
                avail.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):  # inputs produced nowhere (e.g. subgraph captures): keep order
            out.extend(rest)
            break
        pending = rest
    return out


def _isolated_boundaries(fixed, boundaries, captured, in_changes) -> dict:
    """For each boundary tensor, the fixed model's region evaluated on the ORIGINAL model's values of
    the tensors it reads (``captured``, one dict per input set), so a rewrite is judged on its own (not
    on differences from upstream rewrites). All regions are cut out as one model and run in one
    session (one per region only when that fails). Returns {tensor: (original values, fixed
    values)}; regions that cannot be cut out are left to the whole-model comparison."""
    from onnx.utils import Extractor

    out: dict = {}
    wanted = [b for b in boundaries if b.inputs]
    if not wanted or not captured:
        return out
    fixed_names = _tensor_names(fixed) | {i.name for i in fixed.graph.input}
    try:
        extractor = Extractor(prepare_for_runtime(fixed))
    except Exception:  # noqa: BLE001 - fall back to the whole-model comparison
        return out

    def run(group):
        ins = sorted({t for b in group for t in b.inputs if t in captured[0] and t in fixed_names})
        if not ins:
            return False
        tensors = [b.tensor for b in group]
        try:
            sess = session(extractor.extract_model(ins, tensors))
        except Exception:  # noqa: BLE001
            return False
        need = [i.name for i in sess.get_inputs()]
        if any(n not in captured[0] for n in need):
            return False
        want = {i.name: NP_TYPES.get(i.type) for i in sess.get_inputs()}
        ref: dict[str, list] = {t: [] for t in tensors}
        got: dict[str, list] = {t: [] for t in tensors}
        try:
            for vals in captured:
                feed = {n: _as_int8_if_shifted(vals[n], want[n]) for n in need}
                if any(k in in_changes for k in feed):
                    feed = {k: _edge_in(v, in_changes[k]) if k in in_changes else v for k, v in feed.items()}
                for t, g in zip(tensors, sess.run(tensors, feed)):
                    g = np.asarray(g)
                    ref[t].append(_as_int8_if_shifted(np.asarray(vals[t]), g.dtype.type).reshape(-1))
                    got[t].append(g.reshape(-1))
        except Exception:  # noqa: BLE001 - a region onnxruntime cannot run alone: whole-model comparison
            return False
        for t in tensors:
            out[t] = (np.concatenate(ref[t]), np.concatenate(got[t]))
        return True

    if not run(wanted):
        for b in wanted:
            run([b])
    return out


def _region_model(fixed: onnx.ModelProto, boundaries: Sequence[BoundaryCheck],
                  vals: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, list[str]] | None:
    """All rewritten regions of :func:`_isolated_boundaries` cut out of ``fixed`` as one model, as its
    first attempt cuts them (``vals``: the first input set's captured values), and their boundary
    tensors; None where that attempt would not get as far as a session."""
    from onnx.utils import Extractor

    wanted = [b for b in boundaries if b.inputs]
    if not wanted:
        return None
    fixed_names = _tensor_names(fixed) | {i.name for i in fixed.graph.input}
    ins = sorted({t for b in wanted for t in b.inputs if t in vals and t in fixed_names})
    if not ins:
        return None
    tensors = [b.tensor for b in wanted]
    try:
        return Extractor(prepare_for_runtime(fixed)).extract_model(ins, tensors), tensors
    except Exception:  # noqa: BLE001
        return None


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


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node for o in n.output if o}


class _NodeNames:
    """A graph's nodes, each one's input and output names (``node.input[:]``, ``node.output[:]``)
    and each tensor's producer, each read off the graph once, when first asked for."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph

    @functools.cached_property
    def nodes(self) -> list[onnx.NodeProto]:
        """The nodes (each wrapper made once: the gate's walks read the lists)."""
        return list(self.graph.node)

    @functools.cached_property
    def reads(self) -> list[list[str]]:
        return [n.input[:] for n in self.nodes]

    @functools.cached_property
    def writes(self) -> list[list[str]]:
        return [n.output[:] for n in self.nodes]

    def names(self) -> tuple[list[list[str]], list[list[str]]]:
        """(:attr:`reads`, :attr:`writes`): :func:`begin_session`'s ``names``."""
        return self.reads, self.writes

    @functools.cached_property
    def producer(self) -> dict[str, onnx.NodeProto]:
        return {o: n for n, outs in zip(self.nodes, self.writes) for o in outs if o}


class _Facts:
    """What the gate's proof reads of the original and the fixed model (tensor names, producers,
    tensors computed from initializers alone), each read off the graphs once, when first asked for,
    rather than once per check. The models are not edited while the gate holds it."""

    def __init__(self, original: onnx.ModelProto, fixed: onnx.ModelProto):
        self.original, self.fixed = original, fixed
        #: each model's nodes, their names and producers (:class:`_NodeNames`)
        self.o, self.f = _NodeNames(original.graph), _NodeNames(fixed.graph)
        #: (the unproven nodes :func:`proven_equal` returned, the ids of those among them that are
        #: the original's node of the same output), or None: :func:`rewritten_part` reads it
        self.alike: tuple[list, set[int]] | None = None

    @functools.cached_property
    def f_inits(self) -> dict[str, onnx.TensorProto]:
        """The fixed model's initializers by name (the last of a name)."""
        return {t.name: t for t in self.fixed.graph.initializer}

    @functools.cached_property
    def o_made(self) -> set[str]:
        """:func:`_tensor_names` of the original."""
        return set(self.o.producer)

    @functools.cached_property
    def f_made(self) -> set[str]:
        """:func:`_tensor_names` of the fixed model."""
        return set(self.f.producer)

    @functools.cached_property
    def f_const(self) -> set[str]:
        """:func:`_computed_from_initializers` of the fixed model."""
        return _computed_from_initializers(self.fixed, self.f.reads, self.f.writes)


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """``model`` with ``names`` among its graph outputs too (each once; a copy, where there are any)."""
    if not names:
        return model
    from .segments import with_extra

    m = onnx.ModelProto()
    m.CopyFrom(model)
    declared = [o.name for o in m.graph.output]
    for n in with_extra(declared, names)[len(declared):]:  # (what a segmented session fetches too)
        m.graph.output.append(onnx.helper.ValueInfoProto(name=n))
    return m


def _scalar(v) -> float:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError("per-axis edge quantization is not supported by the gate")
    return a.reshape(-1)[0].item()
