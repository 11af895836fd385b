"""TFLite flatbuffer -> QDQ ONNX importer (own importer over the ``tflite`` flatbuffer package).

Every TFLite tensor becomes an ONNX value; a quantized tensor (int8/uint8, per tensor or per axis)
becomes ``QuantizeLinear -> int8 tensor -> DequantizeLinear`` with the tensor's own scale and
zero-point, and a quantized constant becomes an int8 initializer behind a ``DequantizeLinear``. The
float ONNX operator between them computes what the TFLite kernel computes, so the QDQ graph is the
same network the TFLite interpreter runs (checked by :mod:`fixer.importers.tflite_check`).

Layout: TFLite is NHWC; ONNX spatial operators are NCHW. A 4-D activation is carried NCHW between
spatial operators, and a Transpose is inserted only where an operator needs the TFLite (NHWC) order
(Reshape, Transpose, FullyConnected on a 4-D input, graph edges), as stedgeai's own TFLite reader does.
Graph inputs and outputs keep the TFLite shapes and types. Every node carries the TFLite operator it
came from (``tflite.op``, ``tflite.index``, ``tflite.fused_activation``, ``tflite.options`` in its
``metadata_props`` and doc_string); inserted layout Transposes carry ``nafix.tflite.layout``; the model
carries ``nafix.source_format=tflite``. docs/TFLITE.md lists these markers.
"""

from __future__ import annotations

import json
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import InputError

#: The flatbuffer file identifier of a TFLite model (bytes 4..8 of the file).
TFLITE_IDENTIFIER = b"TFL3"
#: Opset of the imported graph (per-axis DequantizeLinear needs 13, HardSwish 14).
IMPORT_OPSET = 14
IMPORT_IR_VERSION = 10

NCHW = (0, 3, 1, 2)  # NHWC tensor -> NCHW tensor
NHWC = (0, 2, 3, 1)  # NCHW tensor -> NHWC tensor


def is_tflite(data: bytes) -> bool:
    """True when ``data`` starts like a TFLite flatbuffer (identifier ``TFL3`` at bytes 4..8)."""
    return len(data) >= 8 and data[4:8] == TFLITE_IDENTIFIER


#: The largest tensor nafix imports, in bytes of its TFLite type: far above any tensor of a model for
#: an MCU NPU (the STM32N6 has 4.2 MB of on-chip RAM; external memories are at most a few hundred
#: MB), and small enough that nafix's own arrays of it (float32 and int64 copies) fit in memory.
MAX_TENSOR_BYTES = 256 * 2**20
#: The most dimensions a TFLite tensor has (TFLite kernels take at most 6; reshapes up to 8).
MAX_RANK = 8
_TYPE_BYTES = {"FLOAT32": 4, "INT8": 1, "UINT8": 1, "INT32": 4, "INT64": 8, "BOOL": 1, "FLOAT16": 2, "INT16": 2}


class UnsupportedTFLite(InputError):
    """A TFLite model nafix cannot import (unsupported, custom or flex op, float16 weights...)."""


def _enum_names(cls) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


@dataclass
class _Val:
    """One TFLite tensor as it exists in the ONNX graph being built."""

    f: str | None  # float value (after DequantizeLinear for a quantized tensor)
    q: str | None  # integer (quantized) value, or None for a float / int32 value
    nchw: bool  # the ONNX value is the TFLite 4-D tensor permuted to NCHW
    const: np.ndarray | None = None  # TFLite-order value when known at import time
    cache: dict = field(default_factory=dict)


@dataclass
class ImportedTFLite:
    """The imported ONNX model and what the runtime check needs to compare it with the interpreter."""

    model: onnx.ModelProto
    #: TFLite tensor index -> (ONNX integer tensor name, is that ONNX tensor NCHW) for every quantized
    #: tensor an operator produces (the op-by-op check feeds and compares these).
    quantized_outputs: dict[int, tuple[str, bool]]
    #: TFLite operator index -> (op name, its quantized output tensor indices).
    ops: list[tuple[str, list[int]]]
    op_counts: dict[str, int]
    input_names: list[str]
    output_names: list[str]
    #: ONNX input/output name -> TFLite tensor index.
    io_tensors: dict[str, int]
    #: The TFLite file's bytes (the interpreter check runs on them).
    data: bytes = b""
    #: The interpreter check, once run (:func:`fixer.importers.tflite_check.check_import`).
    check: object | None = None
    source_format: str = "tflite"
    #: Integer graph input -> the size of the axis it indexes (GATHER / EMBEDDING_LOOKUP indices): the
    #: import check feeds such an input values in [0, size), as the interpreter refuses others.
    index_bounds: dict[str, int] = field(default_factory=dict)


def read_tflite(path: Path) -> ImportedTFLite:
    """Read and import the TFLite file at ``path`` (errors are one InputError sentence)."""
    from ..fsutil import read_bytes

    try:
        data = read_bytes(path)  # a FIFO or device is refused, never read
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc}).") from None
    return import_tflite(data, path)


def import_tflite(data: bytes, path: Path | str = "<tflite>") -> ImportedTFLite:
    """Import a TFLite flatbuffer into a QDQ ONNX model."""
    try:
        import tflite  # noqa: F401
    except ImportError:  # pragma: no cover - a dependency of nafix
        raise InputError(f"{path}: reading TFLite needs the 'tflite' package (pip install tflite).") from None
    if not is_tflite(data):
        raise InputError(f"{path}: not a TFLite model (bytes 4..8 are not the 'TFL3' identifier of a TFLite "
                         "flatbuffer).")
    imp = _Importer(data, Path(path))
    try:
        return imp.run()
    except InputError:
        raise
    except (struct.error, IndexError, ValueError, TypeError, AttributeError, KeyError, ArithmeticError,
            MemoryError, RecursionError, OverflowError) as exc:
        raise InputError(_corrupt_sentence(path, len(data), imp.at, exc)) from None


def _corrupt_sentence(path, size: int, at: str, exc: BaseException) -> str:
    """One sentence for a flatbuffer the reader failed on: what was being read, and where it broke
    (the byte a reference pointed to, when the reader says), never the reader's exception text."""
    where = f" while reading {at}" if at else ""
    m = re.search(r"at offset (\d+)", str(exc)) if isinstance(exc, struct.error) else None
    if m is not None or isinstance(exc, (struct.error, IndexError)):
        if m is not None and int(m.group(1)) >= size:
            past = f"it refers to byte {int(m.group(1))}, past the end of the {size}-byte file"
        else:
            past = f"a reference in it points outside the {size}-byte file"
        return (f"{path}: not a complete TFLite flatbuffer{where}: {past} (the file is truncated or corrupt).")
    if isinstance(exc, (MemoryError, OverflowError)):
        return (f"{path}: not a valid TFLite flatbuffer{where}: a size or count in it is too large to be "
                "real (the file is corrupt).")
    if isinstance(exc, RecursionError):
        return f"{path}: not a valid TFLite flatbuffer{where}: its tables nest without end (the file is corrupt)."
    return (f"{path}: not a valid TFLite flatbuffer{where}: a field holds a value of the wrong kind or out of "
            "range (the file is truncated or corrupt).")


class _Importer:
    def __init__(self, data: bytes, path: Path):
        import tflite

        self.tfl = tflite
        self.data = data
        self.path = path
        self.op_names = _enum_names(tflite.BuiltinOperator)
        self.type_names = _enum_names(tflite.TensorType)
        self.act_names = _enum_names(tflite.ActivationFunctionType)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.names: set[str] = set()
        self.vals: dict[int, _Val] = {}
        self.qouts: dict[int, tuple[str, bool]] = {}
        self.cur: dict | None = None  # TFLite provenance stamped on nodes being created
        self.graph_outputs: set[int] = set()
        self.reshaped_from: dict[int, int] = {}  # RESHAPE output -> its input tensor
        self.at = "the model header"  # what is being read (for the sentence of a corrupt file)

    # -- flatbuffer access ----------------------------------------------------------------------
    def fail(self, msg: str):
        raise UnsupportedTFLite(f"{self.path}: {msg}")

    def run(self) -> ImportedTFLite:
        tfl = self.tfl
        if len(self.data) < 16:
            raise InputError(f"{self.path}: not a complete TFLite flatbuffer: the file has only {len(self.data)} "
                             "bytes (truncated).")
        root = struct.unpack_from("<I", self.data, 0)[0]
        if root + 4 > len(self.data):
            raise InputError(f"{self.path}: not a complete TFLite flatbuffer: its root table offset {root} is "
                             f"past the end of the {len(self.data)}-byte file (truncated or corrupt).")
        m = tfl.Model.GetRootAsModel(self.data, 0)
        self.m = m
        if m.Version() != 3:
            self.fail(f"TFLite schema version {m.Version()} is not 3.")
        if m.SubgraphsLength() < 1:
            self.fail("the model has no subgraph.")
        self.at = "subgraph 0"
        sg = m.Subgraphs(0)
        self.sg = sg
        # Operator codes, custom and flex ops first: they make the whole model unusable.
        self.codes: list[str] = []
        for i in range(m.OperatorCodesLength()):
            self.at = f"operator code {i}"
            oc = m.OperatorCodes(i)
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            name = self.op_names.get(code, f"BUILTIN_{code}")
            if name == "CUSTOM":
                cc = (oc.CustomCode() or b"").decode("utf-8", "replace")
                if cc.startswith("Flex"):
                    self.fail(f"uses the flex (TensorFlow) op '{cc}', which stedgeai and nafix cannot read; "
                              "convert without SELECT_TF_OPS.")
                self.fail(f"uses the custom op '{cc}', which nafix cannot import.")
            self.codes.append(name)
        n_ops = sg.OperatorsLength()
        ops = []
        for i in range(n_ops):
            self.at = f"operator {i}"
            op = sg.Operators(i)
            if op.OpcodeIndex() >= len(self.codes):
                raise InputError(f"{self.path}: corrupt TFLite flatbuffer (operator {i} has opcode index "
                                 f"{op.OpcodeIndex()} of {len(self.codes)}).")
            ops.append((op, self.codes[op.OpcodeIndex()]))
        counts = Counter(name for _, name in ops)
        unsupported = sorted(n for n in counts if n not in _HANDLERS)
        if unsupported:
            self.fail(f"TFLite operator(s) {', '.join(unsupported)} not supported by nafix's importer "
                      f"(supported: {', '.join(sorted(_HANDLERS))}).")
        self._check_tensors()
        self.at = "the graph inputs and outputs"

        # Graph inputs and outputs keep their TFLite names (made unique and ONNX-safe).
        in_idx = [int(sg.Inputs(i)) for i in range(sg.InputsLength())]
        out_idx = [int(sg.Outputs(i)) for i in range(sg.OutputsLength())]
        self.graph_outputs = set(out_idx)
        io_names: dict[int, str] = {}
        for t in in_idx + out_idx:
            if t not in io_names:
                io_names[t] = self.uniq(self.tname(t))
        self.input_tensor_names = {t: io_names[t] for t in in_idx}
        self.index_bounds: dict[str, int] = {}
        graph_inputs = []
        self.cur = {"nafix.tflite.edge": "input"}
        for t in in_idx:
            name = io_names[t]
            ten = sg.Tensors(t)
            dt = self.onnx_type(t)
            graph_inputs.append(helper.make_tensor_value_info(name, dt, [int(d) for d in self.shape(t)]))
            if self.is_quant(t):
                self.vals[t] = _Val(f=None, q=name, nchw=False)
                self.vals[t].f = self.dq(name, t, nchw=False)
            else:
                self.vals[t] = _Val(f=name, q=None, nchw=False)
            del ten

        op_records: list[tuple[str, list[int]]] = []
        self.at = "the operator patterns"
        plan = _plan_fusions(self, ops)  # operator index -> the handler that replaces its own
        for i, (op, name) in enumerate(ops):
            self.at = f"operator {i} ({name})"
            opts = self.options(op, name)
            self.cur = {"tflite.op": name, "tflite.index": str(i)}
            fused = self.fused_name(opts)
            if fused and fused != "NONE":
                self.cur["tflite.fused_activation"] = fused
            extra = _describe_options(opts)
            if extra:
                self.cur["tflite.options"] = json.dumps(extra, sort_keys=True)
            ins = [int(op.Inputs(j)) for j in range(op.InputsLength())]
            outs = [int(op.Outputs(j)) for j in range(op.OutputsLength())]
            plan.get(i, _HANDLERS[name])(self, ins, outs, opts)
            op_records.append((name, [t for t in outs if t in self.qouts]))
        self.cur = None
        self.at = "the graph outputs"

        # Graph outputs: in TFLite order and type, renamed to the TFLite tensor names.
        graph_outputs = []
        rename: dict[str, str] = {}
        for t in out_idx:
            if t not in self.vals:
                self.fail(f"graph output tensor {t} ('{self.tname(t)}') is produced by no operator.")
            v = self.vals[t]
            if v.const is not None and v.q is None and v.f is None:
                self.fail(f"graph output '{self.tname(t)}' is a constant.")
            src = self.plain(t, quantized=self.is_quant(t))
            target = io_names[t]
            if src in rename or any(src == n for n in [i.name for i in graph_inputs]):
                self.node("Identity", [src], [target])
            else:
                rename[src] = target
            graph_outputs.append(helper.make_tensor_value_info(
                target, self.onnx_type(t), [int(d) for d in self.shape(t)]))
        for n in self.nodes:
            for k, o in enumerate(n.output):
                if o in rename:
                    n.output[k] = rename[o]
            for k, o in enumerate(n.input):
                if o in rename:
                    n.input[k] = rename[o]
        for t, (qn, lay) in list(self.qouts.items()):
            if qn in rename:
                self.qouts[t] = (rename[qn], lay)

        self._prune([o.name for o in graph_outputs])
        graph = helper.make_graph(self.nodes, self.graph_name(), graph_inputs, graph_outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", IMPORT_OPSET)],
                                  producer_name="nafix-tflite-import")
        model.ir_version = IMPORT_IR_VERSION
        desc = m.Description()
        meta = {
            "nafix.source_format": "tflite",
            "nafix.tflite.schema_version": str(m.Version()),
            "nafix.tflite.op_counts": json.dumps(dict(sorted(counts.items()))),
            "nafix.tflite.layout": "NHWC",
        }
        if desc:
            meta["nafix.tflite.description"] = desc.decode("utf-8", "replace")[:200]
        helper.set_model_props(model, meta)
        return ImportedTFLite(
            model=model, quantized_outputs=dict(self.qouts), ops=op_records, op_counts=dict(counts),
            input_names=[io_names[t] for t in in_idx], output_names=[io_names[t] for t in out_idx],
            io_tensors={io_names[t]: t for t in in_idx + out_idx}, data=self.data,
            index_bounds=dict(self.index_bounds),
        )

    def _prune(self, outputs: list[str]):
        """Drop nodes and initializers nothing reads (e.g. a reshape another reshape now bypasses)."""
        live = set(outputs)
        kept = []
        for n in reversed(self.nodes):
            if any(o in live for o in n.output):
                kept.append(n)
                live.update(i for i in n.input if i)
        self.nodes = kept[::-1]
        self.inits = [t for t in self.inits if t.name in live]
        produced = {o for n in self.nodes for o in n.output}
        self.qouts = {t: v for t, v in self.qouts.items() if v[0] in produced or v[0] in outputs}

    def graph_name(self) -> str:
        name = self.sg.Name()
        return (name.decode("utf-8", "replace") if name else "") or self.path.stem or "tflite"

    def _check_tensors(self):
        sg, m = self.sg, self.m
        nbuf = m.BuffersLength()
        for t in range(sg.TensorsLength()):
            self.at = f"tensor {t}"
            ten = sg.Tensors(t)
            tname = self.type_names.get(ten.Type(), str(ten.Type()))
            self._check_shape(t, ten, tname)
            b = ten.Buffer()
            if b >= nbuf:
                raise InputError(f"{self.path}: corrupt TFLite flatbuffer (tensor {t} uses buffer {b} of {nbuf}).")
            buf = m.Buffers(b)
            has_data = buf.DataLength() > 0 or buf.Offset() > 1
            if tname == "FLOAT16":
                self.fail(f"tensor '{self.tname(t)}' is float16: float16 TFLite models are not supported "
                          "(export the model as int8, or as float32).")
            if tname not in ("FLOAT32", "INT8", "UINT8", "INT32", "INT64", "BOOL"):
                if tname == "INT16":
                    self.fail(f"tensor '{self.tname(t)}' is int16: 16x8 quantized TFLite models are not supported.")
                self.fail(f"tensor '{self.tname(t)}' has type {tname}, which nafix cannot import.")
            if ten.ShapeSignatureLength() and any(int(d) < 0 for d in ten.ShapeSignatureAsNumpy()):
                sig = [int(d) for d in ten.ShapeSignatureAsNumpy()]
                if not (sig[0] < 0 and all(d >= 0 for d in sig[1:])):
                    self.fail(f"tensor '{self.tname(t)}' has a dynamic shape {sig} (only a dynamic batch, "
                              "taken as 1 as stedgeai does, is supported).")
            if has_data and buf.Offset() > 1:
                end = buf.Offset() + buf.Size()
                if end > len(self.data):
                    raise InputError(f"{self.path}: not a complete TFLite flatbuffer: buffer {b} (tensor "
                                     f"'{self.tname(t)}') ends at byte {end}, past the end of the "
                                     f"{len(self.data)}-byte file (truncated or corrupt).")

    def _check_shape(self, t: int, ten, type_name: str) -> None:
        """A tensor's shape must be one a model can have: no negative dimension (a dynamic one is in the
        shape signature, not the shape), at most :data:`MAX_RANK` dimensions and
        :data:`MAX_TENSOR_BYTES` bytes (a corrupt or hostile file would make nafix allocate it)."""
        rank = ten.ShapeLength()
        if rank > MAX_RANK:
            raise InputError(f"{self.path}: not a valid TFLite model: tensor {t} claims {rank} dimensions (a TFLite "
                             f"tensor has at most {MAX_RANK}; the file is corrupt).")
        if rank == 0:
            return
        dims = [int(d) for d in ten.ShapeAsNumpy()]
        if any(d < 0 for d in dims):
            raise InputError(f"{self.path}: not a valid TFLite model: tensor '{self.tname(t)}' has the shape {dims}, "
                             "with a negative dimension (a dynamic one belongs in the shape signature; the file "
                             "is corrupt).")
        n = 1
        for d in dims:
            n *= d
        size = n * _TYPE_BYTES.get(type_name, 4)
        if size > MAX_TENSOR_BYTES:
            raise InputError(f"{self.path}: TFLite tensor '{self.tname(t)}' has the shape {dims}: {n:,} elements, "
                             f"{size / 2**30:,.1f} GiB, more than any model for the STM32N6 can hold (nafix refuses "
                             f"tensors over {MAX_TENSOR_BYTES // 2**20} MiB; the file is corrupt or not a model for "
                             "an MCU).")

    def tname(self, t: int) -> str:
        raw = self.sg.Tensors(t).Name()
        name = raw.decode("utf-8", "replace") if raw else f"tensor_{t}"
        return re.sub(r"[^A-Za-z0-9_./:;-]", "_", name) or f"tensor_{t}"

    def shape(self, t: int) -> tuple[int, ...]:
        ten = self.sg.Tensors(t)
        if ten.ShapeLength() == 0:
            return ()
        return tuple(int(d) for d in ten.ShapeAsNumpy())

    def ttype(self, t: int) -> str:
        return self.type_names[self.sg.Tensors(t).Type()]

    def onnx_type(self, t: int) -> int:
        return {"FLOAT32": TensorProto.FLOAT, "INT8": TensorProto.INT8, "UINT8": TensorProto.UINT8,
                "INT32": TensorProto.INT32, "INT64": TensorProto.INT64, "BOOL": TensorProto.BOOL}[self.ttype(t)]

    def qparams(self, t: int):
        """(scales, zero_points, quantized_dimension) or None."""
        q = self.sg.Tensors(t).Quantization()
        if q is None or q.ScaleLength() == 0:
            return None
        s = np.asarray(q.ScaleAsNumpy(), dtype=np.float32).reshape(-1)
        z = np.asarray(q.ZeroPointAsNumpy(), dtype=np.int64).reshape(-1) if q.ZeroPointLength() else \
            np.zeros(s.shape, np.int64)
        if z.size == 1 and s.size > 1:
            z = np.full(s.shape, int(z[0]), np.int64)
        return s, z, int(q.QuantizedDimension())

    def is_quant(self, t: int) -> bool:
        return self.ttype(t) in ("INT8", "UINT8") and self.qparams(t) is not None

    def buffer(self, t: int) -> np.ndarray | None:
        ten = self.sg.Tensors(t)
        buf = self.m.Buffers(ten.Buffer())
        np_dt = {"FLOAT32": np.float32, "INT8": np.int8, "UINT8": np.uint8, "INT32": np.int32,
                 "INT64": np.int64, "BOOL": np.bool_}[self.ttype(t)]
        if buf.Offset() > 1:
            raw = self.data[buf.Offset(): buf.Offset() + buf.Size()]
        elif buf.DataLength() > 0:
            raw = buf.DataAsNumpy().tobytes()
        else:
            return None
        shape = self.shape(t)
        arr = np.frombuffer(raw, dtype=np_dt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise InputError(f"{self.path}: corrupt TFLite flatbuffer (tensor '{self.tname(t)}' has "
                             f"{arr.size} values for shape {list(shape)}).")
        return arr.reshape(shape).copy()

    def options(self, op, name: str):
        table = op.BuiltinOptions()
        if table is None:
            return None
        cls_name = _OPTIONS.get(name)
        if cls_name is None:
            return None
        cls = getattr(self.tfl, cls_name)
        opts = cls()
        opts.Init(table.Bytes, table.Pos)
        return opts

    def fused_name(self, opts) -> str | None:
        if opts is None or not hasattr(opts, "FusedActivationFunction"):
            return None
        return self.act_names.get(opts.FusedActivationFunction(), "UNKNOWN")

    # -- graph building ---------------------------------------------------------------------------
    def uniq(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}__{k}"
        self.names.add(name)
        return name

    def node(self, op_type: str, inputs: list[str], outputs: list[str] | None = None, *,
             layout: str | None = None, **attrs) -> list[str]:
        if outputs is None:
            outputs = [self.uniq(f"{op_type.lower()}_{len(self.nodes)}")]
        n = helper.make_node(op_type, inputs, outputs, name=self.uniq(f"{op_type}_{len(self.nodes)}"), **attrs)
        meta: dict[str, str] = {}
        if layout is not None:
            meta["nafix.tflite.layout"] = layout
        elif self.cur:
            meta.update(self.cur)
        if meta:
            n.doc_string = ";".join(f"{k}={v}" for k, v in meta.items())
            for k, v in meta.items():
                e = n.metadata_props.add()
                e.key, e.value = k, v
        self.nodes.append(n)
        return outputs

    def init(self, base: str, arr: np.ndarray) -> str:
        name = self.uniq(base)
        self.inits.append(numpy_helper.from_array(np.array(arr, order="C"), name))
        return name

    def dq(self, qname: str, t: int, *, nchw: bool, perm_axis=None) -> str:
        """DequantizeLinear of integer tensor ``qname`` with tensor ``t``'s quantization."""
        s, z, qd = self.qparams(t)
        zdt = np.uint8 if self.ttype(t) == "UINT8" else (np.int32 if self.ttype(t) == "INT32" else np.int8)
        base = self.tname(t)
        attrs = {}
        if s.size > 1:
            axis = qd if perm_axis is None else perm_axis
            attrs["axis"] = int(axis)
            sn = self.init(base + "_scale", s.astype(np.float32))
            zn = self.init(base + "_zero_point", z.astype(zdt))
        else:
            sn = self.init(base + "_scale", np.float32(s[0]))
            zn = self.init(base + "_zero_point", np.array(z[0], dtype=zdt))
        return self.node("DequantizeLinear", [qname, sn, zn], [self.uniq(base + "_dq")], **attrs)[0]

    def q(self, fname: str, t: int, *, nchw: bool) -> str:
        s, z, qd = self.qparams(t)
        if s.size > 1:
            self.fail(f"tensor '{self.tname(t)}' is an activation quantized per axis, which nafix cannot import.")
        zdt = np.uint8 if self.ttype(t) == "UINT8" else np.int8
        base = self.tname(t)
        sn = self.init(base + "_scale", np.float32(s[0]))
        zn = self.init(base + "_zero_point", np.array(z[0], dtype=zdt))
        return self.node("QuantizeLinear", [fname, sn, zn], [self.uniq(base + "_q")])[0]

    def const_val(self, t: int) -> _Val:
        arr = self.buffer(t)
        if arr is None:
            self.fail(f"operator input tensor '{self.tname(t)}' is neither produced nor constant.")
        return _Val(f=None, q=None, nchw=False, const=arr)

    def val(self, t: int) -> _Val:
        if t not in self.vals:
            self.vals[t] = self.const_val(t)
        return self.vals[t]

    def const_array(self, t: int) -> np.ndarray | None:
        """The TFLite-order value of ``t`` when it is known at import time (weights, folded shapes)."""
        return self.val(t).const

    def rank(self, t: int) -> int:
        return len(self.shape(t))

    def fval(self, t: int, nchw: bool) -> str:
        """The float ONNX value of tensor ``t`` in the requested layout."""
        v = self.val(t)
        key = ("f", nchw)
        if key in v.cache:
            return v.cache[key]
        if v.f is None and v.q is None:
            # A constant: int8 weights behind a DequantizeLinear, float/int32 as a plain initializer.
            arr = v.const
            axis = None
            if nchw and arr.ndim == 4:
                arr = arr.transpose(NCHW)
            qp = self.qparams(t)
            if qp is not None and self.ttype(t) in ("INT8", "UINT8", "INT32"):
                if qp[0].size > 1:
                    axis = NHWC.index(qp[2]) if (nchw and arr.ndim == 4) else qp[2]
                qn = self.init(self.tname(t) + "_quantized", arr)
                name = self.dq(qn, t, nchw=nchw, perm_axis=axis)
            else:
                name = self.init(self.tname(t), arr.astype(np.float32) if arr.dtype.kind == "f" else arr)
            v.cache[key] = name
            return name
        if v.nchw == nchw or self.rank(t) != 4:
            name = v.f if v.f is not None else self.dq(v.q, t, nchw=v.nchw)
            v.cache[key] = name
            return name
        # Layout change: transpose the integer tensor when there is one (Q -> Transpose -> DQ).
        if v.q is not None:
            qn = self.qval(t, nchw)
            name = self.dq(qn, t, nchw=nchw)
        else:
            perm = NCHW if nchw else NHWC
            name = self.node("Transpose", [v.f], [self.uniq(self.tname(t) + ("_nchw" if nchw else "_nhwc"))],
                             layout=_layout_tag(nchw), perm=list(perm))[0]
        v.cache[key] = name
        return name

    def qval(self, t: int, nchw: bool) -> str:
        """The integer ONNX value of quantized tensor ``t`` in the requested layout."""
        v = self.val(t)
        if v.q is None:
            self.fail(f"tensor '{self.tname(t)}' has no quantized value.")
        if v.nchw == nchw or self.rank(t) != 4:
            return v.q
        key = ("q", nchw)
        if key not in v.cache:
            perm = NCHW if nchw else NHWC
            v.cache[key] = self.node("Transpose", [v.q], [self.uniq(self.tname(t) + ("_nchw" if nchw else "_nhwc"))],
                                     layout=_layout_tag(nchw), perm=list(perm))[0]
        return v.cache[key]

    def plain(self, t: int, *, quantized: bool) -> str:
        return self.qval(t, False) if quantized else self.fval(t, False)

    def emit(self, t: int, fname: str, nchw: bool, fused: str | None = None):
        """Record operator output ``t`` computed as float ``fname`` (applies the fused activation and
        the tensor's quantization)."""
        if nchw and self.rank(t) != 4:
            nchw = False
        fname = self.activation(fname, fused, t)
        if self.is_quant(t):
            qn = self.q(fname, t, nchw=nchw)
            self.qouts[t] = (qn, nchw)
            v = _Val(f=None, q=qn, nchw=nchw)
            self.vals[t] = v
            v.f = self.dq(qn, t, nchw=nchw)
            v.cache[("f", nchw)] = v.f
        else:
            if self.ttype(t) == "UINT8" or self.ttype(t) == "INT8":
                self.fail(f"tensor '{self.tname(t)}' is {self.ttype(t).lower()} without quantization parameters.")
            self.vals[t] = _Val(f=fname, q=None, nchw=nchw)

    def is_const(self, t: int) -> bool:
        v = self.val(t)
        return v.const is not None and v.f is None and v.q is None

    def foldable(self, x: int, y: int) -> bool:
        """``y`` computed from constant ``x`` alone can be a constant (same quantization, or none)."""
        return self.is_const(x) and (not self.is_quant(y) or self.alias_ok(x, y))

    def alias_ok(self, x: int, y: int) -> bool:
        """Same type and quantization: a value of ``x`` stands for ``y`` up to its shape."""
        qx, qy = self.qparams(x), self.qparams(y)
        same_q = (qx is None and qy is None) or (
            qx is not None and qy is not None and np.array_equal(qx[0], qy[0]) and np.array_equal(qx[1], qy[1]))
        return self.ttype(x) == self.ttype(y) and same_q

    def alias(self, x: int, y: int) -> bool:
        """Make ``y`` the same ONNX value as ``x`` (an operator that changes nothing: a TILE by ones).
        Only when both carry the same type and quantization; returns whether it did."""
        if not self.alias_ok(x, y) or self.shape(x) != self.shape(y) or y in self.graph_outputs:
            return False
        v = self.val(x)
        self.vals[y] = v
        self.reshaped_from[y] = x
        if x in self.qouts:
            self.qouts.setdefault(y, self.qouts[x])
        return True

    def emit_const(self, t: int, arr: np.ndarray):
        self.vals[t] = _Val(f=None, q=None, nchw=False, const=np.asarray(arr))

    def activation(self, fname: str, fused: str | None, t: int) -> str:
        if fused in (None, "NONE"):
            return fname
        if fused == "RELU":
            return self.node("Relu", [fname])[0]
        if fused in ("RELU6", "RELU_N1_TO_1"):
            lo, hi = (0.0, 6.0) if fused == "RELU6" else (-1.0, 1.0)
            return self.node("Clip", [fname, self.init("clip_min", np.float32(lo)),
                                      self.init("clip_max", np.float32(hi))])[0]
        if fused == "TANH":
            return self.node("Tanh", [fname])[0]
        self.fail(f"fused activation {fused} on tensor '{self.tname(t)}' is not supported.")
        return fname

    def ints(self, values, base="shape") -> str:
        return self.init(base, np.asarray(values, dtype=np.int64))

    def layout_of(self, ins: list[int]) -> bool:
        """NCHW when any 4-D non-constant input is carried NCHW."""
        return any(self.val(t).nchw and self.rank(t) == 4 and self.val(t).const is None for t in ins)


def _layout_tag(nchw: bool) -> str:
    return "NHWC->NCHW" if nchw else "NCHW->NHWC"


_BOOL_OPTIONS = ("AlignCorners", "HalfPixelCenters", "KeepDims", "KeepNumDims", "AdjX", "AdjY", "Approximate",
                 "Exclusive", "Reverse")
_NUMBER_OPTIONS = ("Axis", "Beta", "Alpha", "BlockSize", "StrideH", "StrideW", "DilationHFactor",
                   "DilationWFactor", "FilterHeight", "FilterWidth", "DepthMultiplier", "NumSplits", "Num", "Mode")


def _describe_options(opts) -> dict:
    """The operator options placement may need, as JSON-ready values (``tflite.options``)."""
    if opts is None:
        return {}
    out: dict = {}
    for key in _BOOL_OPTIONS + _NUMBER_OPTIONS + ("Padding",):
        fn = getattr(opts, key, None)
        if fn is None:
            continue
        v = fn()
        if key == "Padding":
            out[key] = "SAME" if v == 0 else "VALID"
        elif key in _BOOL_OPTIONS:
            out[key] = bool(v)
        else:
            out[key] = float(v) if isinstance(v, (float, np.floating)) else int(v)
    return out


_OPTIONS = {
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "MAX_POOL_2D": "Pool2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions",
    "FULLY_CONNECTED": "FullyConnectedOptions", "ADD": "AddOptions", "SUB": "SubOptions",
    "MUL": "MulOptions", "DIV": "DivOptions", "CONCATENATION": "ConcatenationOptions",
    "SOFTMAX": "SoftmaxOptions", "RESIZE_BILINEAR": "ResizeBilinearOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions", "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
    "LEAKY_RELU": "LeakyReluOptions", "STRIDED_SLICE": "StridedSliceOptions", "PACK": "PackOptions",
    "TRANSPOSE_CONV": "TransposeConvOptions", "SPLIT": "SplitOptions", "SPLIT_V": "SplitVOptions",
    "DEPTH_TO_SPACE": "DepthToSpaceOptions", "SPACE_TO_DEPTH": "SpaceToDepthOptions",
    "SQUEEZE": "SqueezeOptions", "GATHER": "GatherOptions", "UNPACK": "UnpackOptions",
    "ARG_MAX": "ArgMaxOptions", "ARG_MIN": "ArgMinOptions",
}


# -- operator handlers --------------------------------------------------------------------------------

def _same_pads(in_size: int, k: int, stride: int, dil: int) -> tuple[int, int]:
    out = (in_size + stride - 1) // stride
    eff = (k - 1) * dil + 1
    total = max((out - 1) * stride + eff - in_size, 0)
    return total // 2, total - total // 2


def _conv_pads(imp: _Importer, x: int, kh: int, kw: int, opts) -> list[int]:
    if opts.Padding() != imp.tfl.Padding.SAME:
        return [0, 0, 0, 0]
    _, h, w, _ = imp.shape(x)
    t, b = _same_pads(h, kh, opts.StrideH(), getattr(opts, "DilationHFactor", lambda: 1)() or 1)
    left, right = _same_pads(w, kw, opts.StrideW(), getattr(opts, "DilationWFactor", lambda: 1)() or 1)
    return [t, left, b, right]


def _no_hybrid(imp: _Importer, x: int, w: int, y: int, op: str):
    """Float activations with int8 weights is TFLite's dynamic-range (hybrid) kernel, which quantizes
    the input at run time: not a computation a QDQ graph reproduces."""
    if imp.ttype(x) == "FLOAT32" and imp.ttype(w) in ("INT8", "UINT8"):
        imp.fail(f"{op} '{imp.tname(y)}' has float input and {imp.ttype(w).lower()} weights: dynamic-range "
                 "(hybrid) quantized models are not supported; export a fully int8 model (or a float one).")


def _weights(imp: _Importer, t: int, perm: tuple[int, ...]) -> str:
    """Constant ``t`` permuted by ``perm``: an int8 initializer behind DequantizeLinear (axis follows)."""
    arr = imp.const_array(t)
    if arr is None:
        imp.fail(f"weights '{imp.tname(t)}' are not constant.")
    arr = arr.transpose(perm)
    qp = imp.qparams(t)
    if qp is None or imp.ttype(t) == "FLOAT32":
        if imp.ttype(t) != "FLOAT32":
            imp.fail(f"weights '{imp.tname(t)}' are {imp.ttype(t).lower()} without quantization parameters.")
        return imp.init(imp.tname(t), arr.astype(np.float32))
    axis = perm.index(qp[2]) if qp[0].size > 1 else None
    qn = imp.init(imp.tname(t) + "_quantized", arr)
    return imp.dq(qn, t, nchw=True, perm_axis=axis)


def _bias(imp: _Importer, ins: list[int], k: int) -> list[str]:
    if len(ins) > k and ins[k] >= 0:
        t = ins[k]
        arr = imp.const_array(t)
        if arr is None:
            imp.fail(f"bias '{imp.tname(t)}' is not constant.")
        if imp.ttype(t) == "INT32" and imp.qparams(t) is not None:
            qp = imp.qparams(t)
            qn = imp.init(imp.tname(t) + "_quantized", arr.astype(np.int32))
            return [imp.dq(qn, t, nchw=True, perm_axis=0 if qp[0].size > 1 else None)]
        if imp.ttype(t) == "FLOAT32":
            return [imp.init(imp.tname(t), arr.astype(np.float32))]
        imp.fail(f"bias '{imp.tname(t)}' has type {imp.ttype(t)} (int64 biases of 16x8 models are not supported).")
    return []


def _conv2d(imp, ins, outs, opts):
    _no_hybrid(imp, ins[0], ins[1], outs[0], "CONV_2D")
    x, w = ins[0], ins[1]
    o, kh, kw, ci = imp.shape(w)
    cin = imp.shape(x)[3]
    if cin % ci:
        imp.fail(f"CONV_2D '{imp.tname(outs[0])}': input has {cin} channels, the filter {ci}.")
    pads = _conv_pads(imp, x, kh, kw, opts)
    y = imp.node("Conv", [imp.fval(x, True), _weights(imp, w, (0, 3, 1, 2))] + _bias(imp, ins, 2),
                 kernel_shape=[kh, kw], strides=[opts.StrideH(), opts.StrideW()], pads=pads,
                 dilations=[opts.DilationHFactor() or 1, opts.DilationWFactor() or 1], group=cin // ci)[0]
    imp.emit(outs[0], y, True, imp.fused_name(opts))


def _depthwise(imp, ins, outs, opts):
    _no_hybrid(imp, ins[0], ins[1], outs[0], "DEPTHWISE_CONV_2D")
    x, w = ins[0], ins[1]
    _, kh, kw, co = imp.shape(w)
    cin = imp.shape(x)[3]
    pads = _conv_pads(imp, x, kh, kw, opts)
    y = imp.node("Conv", [imp.fval(x, True), _weights(imp, w, (3, 0, 1, 2))] + _bias(imp, ins, 2),
                 kernel_shape=[kh, kw], strides=[opts.StrideH(), opts.StrideW()], pads=pads,
                 dilations=[opts.DilationHFactor() or 1, opts.DilationWFactor() or 1], group=cin)[0]
    if co % cin:
        imp.fail(f"DEPTHWISE_CONV_2D '{imp.tname(outs[0])}': {co} output channels for {cin} inputs.")
    imp.emit(outs[0], y, True, imp.fused_name(opts))


def _transpose_conv(imp, ins, outs, opts):
    _no_hybrid(imp, ins[2], ins[1], outs[0], "TRANSPOSE_CONV")
    w, x = ins[1], ins[2]  # ins[0] is the output shape, also the output tensor's own shape
    o, kh, kw, ci = imp.shape(w)
    _, h, wd, _ = imp.shape(x)
    _, oh, ow, _ = imp.shape(outs[0])
    sh, sw = opts.StrideH(), opts.StrideW()
    th = max((h - 1) * sh + kh - oh, 0)
    tw = max((wd - 1) * sw + kw - ow, 0)
    pads = [th // 2, tw // 2, th - th // 2, tw - tw // 2]
    y = imp.node("ConvTranspose", [imp.fval(x, True), _weights(imp, w, (3, 0, 1, 2))] + _bias(imp, ins, 3),
                 kernel_shape=[kh, kw], strides=[sh, sw], pads=pads)[0]
    imp.emit(outs[0], y, True, imp.fused_name(opts))


def _pool(kind):
    def handler(imp, ins, outs, opts):
        x = ins[0]
        kh, kw = opts.FilterHeight(), opts.FilterWidth()
        pads = _conv_pads(imp, x, kh, kw, opts) if opts.Padding() == imp.tfl.Padding.SAME else [0, 0, 0, 0]
        y = imp.node(kind, [imp.fval(x, True)], kernel_shape=[kh, kw],
                     strides=[opts.StrideH(), opts.StrideW()], pads=pads)[0]
        imp.emit(outs[0], y, True, imp.fused_name(opts))
    return handler


def _broadcast_operand(imp, t: int, nchw: bool, out_rank: int) -> str:
    """An elementwise operand in the output's layout (constants reshaped to rank 4 then permuted)."""
    v = imp.val(t)
    if v.const is not None and v.f is None and v.q is None and nchw:
        key = ("bcast", out_rank)
        if key not in v.cache:
            arr = v.const
            full = arr.reshape((1,) * (4 - arr.ndim) + arr.shape) if arr.ndim < 4 else arr
            perm_arr = full.transpose(NCHW)
            qp = imp.qparams(t)
            if qp is not None and imp.ttype(t) in ("INT8", "UINT8"):
                if qp[0].size > 1:
                    imp.fail(f"per-axis quantized elementwise constant '{imp.tname(t)}' is not supported.")
                qn = imp.init(imp.tname(t) + "_quantized", perm_arr)
                v.cache[key] = imp.dq(qn, t, nchw=True)
            else:
                v.cache[key] = imp.init(imp.tname(t), perm_arr.astype(np.float32) if perm_arr.dtype.kind == "f"
                                        else perm_arr)
        return v.cache[key]
    if nchw and imp.rank(t) < 4 and v.const is None:
        # A lower-rank activation broadcast against NCHW: reshape its TFLite shape to rank 4, then permute.
        shape = (1,) * (4 - imp.rank(t)) + imp.shape(t)
        r = imp.node("Reshape", [imp.fval(t, False), imp.ints(shape)])[0]
        return imp.node("Transpose", [r], layout=_layout_tag(True), perm=list(NCHW))[0]
    return imp.fval(t, nchw)


def _binary(op_type):
    def handler(imp, ins, outs, opts):
        nchw = imp.layout_of(ins) and imp.rank(outs[0]) == 4
        a = _broadcast_operand(imp, ins[0], nchw, imp.rank(outs[0]))
        b = _broadcast_operand(imp, ins[1], nchw, imp.rank(outs[0]))
        if all(imp.val(t).const is not None and imp.val(t).q is None and imp.val(t).f is None for t in ins) \
                and not imp.is_quant(outs[0]):
            fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
                  "Max": np.maximum, "Min": np.minimum}[op_type]
            imp.emit_const(outs[0], fn(imp.val(ins[0]).const, imp.val(ins[1]).const))
            return
        y = imp.node(op_type, [a, b])[0]
        imp.emit(outs[0], y, nchw, imp.fused_name(opts))
    return handler


def _unary(op_type, **attrs):
    def handler(imp, ins, outs, opts):
        nchw = imp.layout_of(ins[:1])
        y = imp.node(op_type, [imp.fval(ins[0], nchw)], **attrs)[0]
        imp.emit(outs[0], y, nchw)
    return handler


def _relu6(imp, ins, outs, opts):
    nchw = imp.layout_of(ins[:1])
    imp.emit(outs[0], imp.fval(ins[0], nchw), nchw, "RELU6")


def _relu_n1(imp, ins, outs, opts):
    nchw = imp.layout_of(ins[:1])
    imp.emit(outs[0], imp.fval(ins[0], nchw), nchw, "RELU_N1_TO_1")


def _leaky(imp, ins, outs, opts):
    nchw = imp.layout_of(ins[:1])
    y = imp.node("LeakyRelu", [imp.fval(ins[0], nchw)], alpha=float(opts.Alpha()))[0]
    imp.emit(outs[0], y, nchw)


def _prelu(imp, ins, outs, opts):
    nchw = imp.layout_of(ins[:1]) and imp.rank(outs[0]) == 4
    y = imp.node("PRelu", [imp.fval(ins[0], nchw), _broadcast_operand(imp, ins[1], nchw, 4)])[0]
    imp.emit(outs[0], y, nchw)


def _quantize(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    if not imp.is_quant(y):
        imp.fail(f"QUANTIZE output '{imp.tname(y)}' has no quantization parameters.")
    nchw = imp.layout_of([x]) and y not in imp.graph_outputs
    imp.emit(y, imp.fval(x, nchw), nchw)


def _dequantize(imp, ins, outs, opts):
    x = ins[0]
    if imp.ttype(x) == "FLOAT16":  # pragma: no cover - refused earlier with the float16 message
        imp.fail("float16 DEQUANTIZE")
    # A graph output keeps the TFLite layout: transpose the int8 tensor, not the float one.
    nchw = imp.layout_of([x]) and outs[0] not in imp.graph_outputs
    imp.emit(outs[0], imp.fval(x, nchw), nchw)


def _pad(imp, ins, outs, opts):
    x = ins[0]
    pads = imp.const_array(ins[1])
    if pads is None:
        imp.fail(f"PAD '{imp.tname(outs[0])}' has non-constant paddings.")
    pads = np.asarray(pads, np.int64).reshape(-1, 2)
    nchw = imp.layout_of([x]) and len(pads) == 4
    if nchw:
        pads = pads[list(NCHW)]
    value = 0.0
    if len(ins) > 2 and ins[2] >= 0:
        c = imp.const_array(ins[2])
        qp = imp.qparams(ins[2])
        value = float(c.reshape(-1)[0]) if qp is None else float((int(c.reshape(-1)[0]) - qp[1][0]) * qp[0][0])
    pv = imp.init("pad_value", np.float32(value))
    y = imp.node("Pad", [imp.fval(x, nchw), imp.ints(np.concatenate([pads[:, 0], pads[:, 1]]), "pads"), pv])[0]
    imp.emit(outs[0], y, nchw)


def _reduce(op_type):
    def handler(imp, ins, outs, opts):
        x = ins[0]
        axes = imp.const_array(ins[1])
        if axes is None:
            imp.fail(f"{op_type} '{imp.tname(outs[0])}' has non-constant axes.")
        r = imp.rank(x)
        axes = sorted({int(a) % r for a in np.asarray(axes).reshape(-1)})
        keep = bool(opts.KeepDims()) if opts is not None else False
        nchw = imp.layout_of([x]) and r == 4
        if nchw:
            kept = [a for a in range(4) if a not in axes]
            mapped = [NCHW.index(a) for a in kept]
            if not keep and mapped != sorted(mapped):
                nchw = False
        if op_type == "ReduceMean" and r == 4 and axes == [1, 2]:
            # A spatial MEAN is a global average pool, which is how stedgeai reads it too.
            y = imp.node("GlobalAveragePool", [imp.fval(x, True)])[0]
            if not keep:
                y = imp.node("Reshape", [y, imp.ints(imp.shape(outs[0]))])[0]
            imp.emit(outs[0], y, keep)
            return
        onnx_axes = [NCHW.index(a) for a in axes] if nchw else axes
        if op_type == "ReduceSum":
            y = imp.node(op_type, [imp.fval(x, nchw), imp.ints(sorted(onnx_axes), "axes")], keepdims=int(keep))[0]
        else:
            y = imp.node(op_type, [imp.fval(x, nchw)], axes=sorted(onnx_axes), keepdims=int(keep))[0]
        imp.emit(outs[0], y, nchw and keep)
    return handler


def _reshape(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    shape = imp.shape(y)
    if imp.foldable(x, y):
        imp.emit_const(y, imp.val(x).const.reshape(shape))
        return
    # A reshape of a reshape reads the first one's input (same values, one data movement less).
    src = x
    while src in imp.reshaped_from and imp.alias_ok(imp.reshaped_from[src], src):
        src = imp.reshaped_from[src]
    r = imp.node("Reshape", [imp.fval(src, False), imp.ints(shape)])[0]
    imp.emit(y, r, False)
    imp.reshaped_from[y] = src


def _transpose(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    perm = imp.const_array(ins[1])
    if perm is None:
        imp.fail(f"TRANSPOSE '{imp.tname(y)}' has a non-constant permutation.")
    perm = [int(p) for p in np.asarray(perm).reshape(-1)]
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, v.const.transpose(perm))
        return
    if v.nchw and imp.rank(x) == 4 and len(perm) == 4:
        # One Transpose from the NCHW value: TFLite's output[i] is NHWC axis perm[i], NCHW axis NHWC[perm[i]].
        t = imp.node("Transpose", [imp.fval(x, True)], perm=[NHWC[p] for p in perm])[0]
    else:
        t = imp.node("Transpose", [imp.fval(x, False)], perm=perm)[0]
    imp.emit(y, t, False)


def _softmax(imp, ins, outs, opts):
    x = ins[0]
    nchw = imp.layout_of([x]) and imp.rank(x) == 4
    src = imp.fval(x, nchw)
    beta = float(opts.Beta()) if opts is not None else 1.0
    if beta != 1.0:
        src = imp.node("Mul", [src, imp.init("softmax_beta", np.float32(beta))])[0]
    y = imp.node("Softmax", [src], axis=1 if nchw else -1)[0]
    imp.emit(outs[0], y, nchw)


def _concat(imp, ins, outs, opts):
    r = imp.rank(outs[0])
    axis = opts.Axis() % r
    if all(imp.val(t).const is not None and imp.val(t).f is None and imp.val(t).q is None for t in ins) \
            and not imp.is_quant(outs[0]):
        imp.emit_const(outs[0], np.concatenate([imp.val(t).const for t in ins], axis=axis))
        return
    nchw = imp.layout_of(ins) and r == 4
    y = imp.node("Concat", [imp.fval(t, nchw) for t in ins], axis=NCHW.index(axis) if nchw else axis)[0]
    imp.emit(outs[0], y, nchw, imp.fused_name(opts))


def _resize(mode):
    def handler(imp, ins, outs, opts):
        x, y = ins[0], outs[0]
        n, oh, ow, c = imp.shape(y)
        align = bool(opts.AlignCorners()) if opts is not None else False
        hpc = bool(opts.HalfPixelCenters()) if opts is not None else False
        attrs = {"mode": mode}
        if mode == "linear":
            attrs["coordinate_transformation_mode"] = "align_corners" if align else (
                "half_pixel" if hpc else "asymmetric")
        else:
            if align:
                attrs["coordinate_transformation_mode"] = "align_corners"
                attrs["nearest_mode"] = "round_prefer_ceil"
            elif hpc and _integer_upscale(imp.shape(x), imp.shape(y)):
                # floor((x + 0.5) / k) == floor(x / k) for an integer factor k: the NPU's own form
                attrs["coordinate_transformation_mode"] = "asymmetric"
                attrs["nearest_mode"] = "floor"
            elif hpc:  # floor((x + 0.5) * scale), TFLite's half-pixel nearest
                attrs["coordinate_transformation_mode"] = "half_pixel"
                attrs["nearest_mode"] = "round_prefer_ceil"
            else:
                attrs["coordinate_transformation_mode"] = "asymmetric"
                attrs["nearest_mode"] = "floor"
        r = imp.node("Resize", [imp.fval(x, True), "", "", imp.ints([n, c, oh, ow], "sizes")], **attrs)[0]
        imp.emit(y, r, True)
    return handler


def _integer_upscale(xs, ys) -> bool:
    return all(o % i == 0 and o >= i for i, o in zip(xs[1:3], ys[1:3]))


def _fully_connected(imp, ins, outs, opts):
    _no_hybrid(imp, ins[0], ins[1], outs[0], "FULLY_CONNECTED")
    x, w, y = ins[0], ins[1], outs[0]
    if opts is not None and opts.WeightsFormat() != 0:
        imp.fail(f"FULLY_CONNECTED '{imp.tname(y)}' uses shuffled weights, which nafix cannot import.")
    o, i = imp.shape(w)
    src = imp.fval(x, False)
    keep = bool(opts.KeepNumDims()) if opts is not None else False
    xs = imp.shape(x)
    if len(xs) != 2:
        src = imp.node("Reshape", [src, imp.ints([-1, i])])[0]
    wn = _weights(imp, w, (0, 1))
    g = imp.node("Gemm", [src, wn] + _bias(imp, ins, 2), transB=1)[0]
    if keep and len(imp.shape(y)) != 2:
        act = imp.activation(g, imp.fused_name(opts), y)
        g = imp.node("Reshape", [act, imp.ints(imp.shape(y))])[0]
        imp.emit(y, g, False)
        return
    if tuple(imp.shape(y)) != (int(np.prod(xs)) // i, o):
        act = imp.activation(g, imp.fused_name(opts), y)
        g = imp.node("Reshape", [act, imp.ints(imp.shape(y))])[0]
        imp.emit(y, g, False)
        return
    imp.emit(y, g, False, imp.fused_name(opts))


def _strided_slice_spec(imp, ins, outs, opts):
    x = ins[0]
    shape = imp.shape(x)
    begin = np.asarray(imp.const_array(ins[1])).reshape(-1)
    end = np.asarray(imp.const_array(ins[2])).reshape(-1)
    strides = np.asarray(imp.const_array(ins[3])).reshape(-1) if len(ins) > 3 else np.ones_like(begin)
    if opts.EllipsisMask() or opts.NewAxisMask():
        imp.fail(f"STRIDED_SLICE '{imp.tname(outs[0])}' uses an ellipsis or new-axis mask.")
    offset = bool(opts.Offset()) if hasattr(opts, "Offset") else False
    slices = []
    for a in range(len(shape)):
        if a >= len(begin):
            slices.append(slice(None))
            continue
        b, e, s = int(begin[a]), int(end[a]), int(strides[a])
        if offset:
            e = b + e
        if opts.BeginMask() >> a & 1:
            b = None
        if opts.EndMask() >> a & 1:
            e = None
        if opts.ShrinkAxisMask() >> a & 1:
            e = None if b == -1 else (b + 1 if b is not None else 1)
            s = 1
        slices.append(slice(b, e, s))
    return slices


def _strided_slice(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    if any(imp.const_array(t) is None for t in ins[1:4] if t >= 0):
        imp.fail(f"STRIDED_SLICE '{imp.tname(y)}' has non-constant begin/end/strides.")
    slices = _strided_slice_spec(imp, ins, outs, opts)
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, v.const[tuple(slices)].reshape(imp.shape(y)))
        return
    _slice_nodes(imp, x, y, slices)


def _slice_nodes(imp, x, y, slices):
    shape = imp.shape(x)
    nchw = imp.layout_of([x]) and len(shape) == 4 and tuple(imp.shape(y)) != () and len(imp.shape(y)) == 4
    starts, ends, axes, steps = [], [], [], []
    for a, sl in enumerate(slices):
        b, e, s = sl.indices(shape[a])
        if (b, e, s) == (0, shape[a], 1):
            continue
        if s < 0 and e < 0:
            e = -(2**31)  # through index 0
        starts.append(b)
        ends.append(e)
        axes.append(NCHW.index(a) if nchw else a)
        steps.append(s)
    src = imp.fval(x, nchw)
    if axes:
        src = imp.node("Slice", [src, imp.ints(starts, "starts"), imp.ints(ends, "ends"), imp.ints(axes, "axes"),
                                 imp.ints(steps, "steps")])[0]
    expected = tuple(len(range(*sl.indices(shape[a]))) for a, sl in enumerate(slices))
    if tuple(imp.shape(y)) != expected:
        if nchw:
            src = imp.node("Transpose", [src], layout=_layout_tag(False), perm=list(NHWC))[0]
            nchw = False
        src = imp.node("Reshape", [src, imp.ints(imp.shape(y))])[0]
    elif not axes:
        src = imp.node("Identity", [src])[0]
    imp.emit(y, src, nchw)


def _slice(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    begin, size = imp.const_array(ins[1]), imp.const_array(ins[2])
    if begin is None or size is None:
        imp.fail(f"SLICE '{imp.tname(y)}' has non-constant begin/size.")
    shape = imp.shape(x)
    slices = [slice(int(b), shape[a] if int(s) == -1 else int(b) + int(s), 1)
              for a, (b, s) in enumerate(zip(np.reshape(begin, -1), np.reshape(size, -1)))]
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, v.const[tuple(slices)])
        return
    _slice_nodes(imp, x, y, slices)


def _shape(imp, ins, outs, opts):
    dt = np.int64 if imp.ttype(outs[0]) == "INT64" else np.int32
    imp.emit_const(outs[0], np.asarray(imp.shape(ins[0]), dtype=dt))


def _pack(imp, ins, outs, opts):
    axis = opts.Axis() if opts is not None else 0
    if all(imp.val(t).const is not None and imp.val(t).f is None and imp.val(t).q is None for t in ins) \
            and not imp.is_quant(outs[0]):
        imp.emit_const(outs[0], np.stack([imp.val(t).const for t in ins], axis=axis))
        return
    r = imp.rank(outs[0])
    axis %= r
    parts = [imp.node("Unsqueeze", [imp.fval(t, False), imp.ints([axis], "axes")])[0] for t in ins]
    imp.emit(outs[0], imp.node("Concat", parts, axis=axis)[0], False)


def _tile(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    reps = imp.const_array(ins[1])
    if reps is None:
        imp.fail(f"TILE '{imp.tname(y)}' has non-constant multiples.")
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, np.tile(v.const, np.asarray(reps).reshape(-1)))
        return
    reps = np.asarray(reps, np.int64).reshape(-1)
    xs = imp.shape(x)
    if (reps == 1).all() and imp.alias(x, y):
        return
    if len(reps) == 4 and reps[0] == 1 and reps[3] == 1 and xs[1] == 1 and xs[2] == 1:
        # Tiling a 1x1 map over H and W is a nearest upsampling (stedgeai reads it as a resize).
        n, oh, ow, c = imp.shape(y)
        r = imp.node("Resize", [imp.fval(x, True), "", "", imp.ints([n, c, oh, ow], "sizes")], mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")[0]
        imp.emit(y, r, True)
        return
    nchw = imp.layout_of([x]) and len(reps) == 4
    if nchw:
        reps = reps[list(NCHW)]
    imp.emit(y, imp.node("Tile", [imp.fval(x, nchw), imp.ints(reps, "repeats")])[0], nchw)


def _squeeze_like(imp, ins, outs, opts):
    x, y = ins[0], outs[0]
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, v.const.reshape(imp.shape(y)))
        return
    imp.emit(y, imp.node("Reshape", [imp.fval(x, False), imp.ints(imp.shape(y))])[0], False)


def _split(imp, ins, outs, opts, axis_t, x):
    axis = imp.const_array(axis_t)
    if axis is None:
        imp.fail(f"SPLIT '{imp.tname(outs[0])}' has a non-constant axis.")
    r = imp.rank(x)
    axis = int(np.reshape(axis, -1)[0]) % r
    nchw = imp.layout_of([x]) and r == 4
    sizes = [imp.shape(o)[axis] for o in outs]
    names = imp.node("Split", [imp.fval(x, nchw), imp.ints(sizes, "split")],
                     [imp.uniq(f"split_{len(imp.nodes)}_{k}") for k in range(len(outs))],
                     axis=NCHW.index(axis) if nchw else axis)
    for o, n in zip(outs, names):
        imp.emit(o, n, nchw)


def _split_h(imp, ins, outs, opts):
    _split(imp, ins, outs, opts, ins[0], ins[1])


def _split_v(imp, ins, outs, opts):
    _split(imp, ins, outs, opts, ins[2], ins[0])


def _d2s(op_type):
    def handler(imp, ins, outs, opts):
        attrs = {"blocksize": int(opts.BlockSize())}
        if op_type == "DepthToSpace":
            attrs["mode"] = "DCR"
        imp.emit(outs[0], imp.node(op_type, [imp.fval(ins[0], True)], **attrs)[0], True)
    return handler


def _hard_swish(imp, ins, outs, opts):
    nchw = imp.layout_of(ins[:1])
    imp.emit(outs[0], imp.node("HardSwish", [imp.fval(ins[0], nchw)])[0], nchw)


def _gather(imp, ins, outs, opts):
    x, idx, y = ins[0], ins[1], outs[0]
    indices = imp.const_array(idx)
    if indices is None:
        imp.fail(f"GATHER '{imp.tname(y)}' has non-constant indices.")
    axis = opts.Axis() % imp.rank(x)
    v = imp.val(x)
    if imp.foldable(x, y):
        imp.emit_const(y, np.take(v.const, indices, axis=axis))
        return
    imp.emit(y, imp.node("Gather", [imp.fval(x, False), imp.init("indices", np.asarray(indices, np.int64))],
                         axis=axis)[0], False)


def _arg(op_type):
    def handler(imp, ins, outs, opts):
        x, y = ins[0], outs[0]
        axis = imp.const_array(ins[1])
        axis = int(np.reshape(axis, -1)[0]) % imp.rank(x)
        r = imp.node(op_type, [imp.fval(x, False)], axis=axis, keepdims=0)[0]
        if imp.ttype(y) == "INT32":
            r = imp.node("Cast", [r], to=TensorProto.INT32)[0]
        imp.emit(y, r, False)
    return handler


_HANDLERS = {
    "CONV_2D": _conv2d, "DEPTHWISE_CONV_2D": _depthwise, "TRANSPOSE_CONV": _transpose_conv,
    "MAX_POOL_2D": _pool("MaxPool"), "AVERAGE_POOL_2D": _pool("AveragePool"),
    "ADD": _binary("Add"), "SUB": _binary("Sub"), "MUL": _binary("Mul"), "DIV": _binary("Div"),
    "MAXIMUM": _binary("Max"), "MINIMUM": _binary("Min"),
    "RELU": _unary("Relu"), "RELU6": _relu6, "RELU_N1_TO_1": _relu_n1, "LOGISTIC": _unary("Sigmoid"),
    "TANH": _unary("Tanh"), "LEAKY_RELU": _leaky, "PRELU": _prelu, "HARD_SWISH": _hard_swish,
    "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize, "PAD": _pad, "PADV2": _pad,
    "MEAN": _reduce("ReduceMean"), "SUM": _reduce("ReduceSum"), "REDUCE_MAX": _reduce("ReduceMax"),
    "RESHAPE": _reshape, "SQUEEZE": _squeeze_like, "EXPAND_DIMS": _squeeze_like, "TRANSPOSE": _transpose,
    "SOFTMAX": _softmax, "CONCATENATION": _concat, "FULLY_CONNECTED": _fully_connected,
    "RESIZE_BILINEAR": _resize("linear"), "RESIZE_NEAREST_NEIGHBOR": _resize("nearest"),
    "STRIDED_SLICE": _strided_slice, "SLICE": _slice, "SHAPE": _shape, "PACK": _pack, "TILE": _tile,
    "SPLIT": _split_h, "SPLIT_V": _split_v, "DEPTH_TO_SPACE": _d2s("DepthToSpace"),
    "SPACE_TO_DEPTH": _d2s("SpaceToDepth"), "GATHER": _gather, "ARG_MAX": _arg("ArgMax"),
    "ARG_MIN": _arg("ArgMin"),
}

#: Functions that read operator patterns as one operator (``{operator index: handler}``), added by
#: the modules that register more operators (:func:`register_operators`).
_FUSION_PLANNERS: list = []


def register_operators(handlers: dict, options: dict, fusion_planner=None) -> None:
    """Add operator handlers (and the options table each reads) from another module: the transformer,
    element-wise, comparison and data-movement operators of fixer/importers/tflite_ops.py register
    themselves this way, so that module can use this one's helpers with no import circle
    (fixer/importers/__init__.py imports both)."""
    _HANDLERS.update(handlers)
    _OPTIONS.update(options)
    if fusion_planner is not None and fusion_planner not in _FUSION_PLANNERS:
        _FUSION_PLANNERS.append(fusion_planner)


def _plan_fusions(imp, ops) -> dict:
    plan: dict = {}
    for planner in _FUSION_PLANNERS:
        plan.update(planner(imp, ops))
    return plan


def supported_ops() -> tuple[str, ...]:
    """TFLite builtin operators the importer converts (documented in docs/TFLITE.md)."""
    return tuple(sorted(_HANDLERS))
