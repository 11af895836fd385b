"""The gate's inputs: seeded random data in each input's dtype and plausible range (for a float input that
feeds a QuantizeLinear, the range its quantization can represent), or the user's ``--inputs file.npz``,
checked against the model's inputs (names, dtypes, shapes)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from ..errors import InputError
from ..model_io import read_npz
from ..randomdata import uniform
from .runs import session


NP_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16, "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
}


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
