"""Helpers on a raw ``onnx.ModelProto`` shared by the quantization modules: constants, attributes,
opset, unique names, dead-node removal, a small producer/consumer index (:class:`_Graph`) and tensor
renaming.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger(__name__)

#: Newest IR version the supported onnxruntime releases load.
MAX_IR_VERSION = 10

#: Keys onnxruntime's quantizer adds to the model metadata (removed again from nafix's results).
_ORT_METADATA_KEYS = ("onnx.infer", "onnx.quant.pre_process")

_NP_OF_ELEM = {
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64,
    TensorProto.BOOL: np.bool_,
}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_float":
                    out[n.output[0]] = np.array(a.f, np.float32)
                elif a.name == "value_int":
                    out[n.output[0]] = np.array(a.i, np.int64)
    return out


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))


class _ProtoNode:
    """A NodeProto seen with the IR's ``name`` / ``op`` (for :func:`fixer.graph.unique_node_names`)."""

    __slots__ = ("p",)

    def __init__(self, p: onnx.NodeProto):
        self.p = p

    @property
    def name(self) -> str:
        return self.p.name

    @name.setter
    def name(self, value: str) -> None:
        self.p.name = value

    @property
    def op(self) -> str:
        return self.p.op_type


def _unique_names(model: onnx.ModelProto) -> int:
    """Give every node of a model about to go to onnxruntime a unique name (its node lists and nafix's
    placement use them), by the rule of :func:`fixer.graph.unique_node_names`; returns how many
    were renamed."""
    from ..graph import unique_node_names

    return unique_node_names([_ProtoNode(n) for n in model.graph.node])


def _strip_initializer_inputs(model: onnx.ModelProto) -> list[str]:
    """Drop initializers listed as graph inputs (IR < 4 style): they are constants to quantize, not inputs."""
    inits = {t.name for t in model.graph.initializer}
    dropped = [vi.name for vi in model.graph.input if vi.name in inits]
    if dropped:
        keep = [vi for vi in model.graph.input if vi.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        if model.ir_version < 4:
            model.ir_version = 4
    return dropped


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= {i for sn in a.g.node for i in sn.input}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def _clamp_ir(model: onnx.ModelProto) -> None:
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION


def _drop_ort_metadata(model: onnx.ModelProto) -> None:
    keep = [(p.key, p.value) for p in model.metadata_props if p.key not in _ORT_METADATA_KEYS]
    del model.metadata_props[:]
    for k, v in keep:
        model.metadata_props.add(key=k, value=v)


def _remove_dead(model: onnx.ModelProto) -> int:
    """Remove nodes whose outputs nobody reads, then unused initializers; returns nodes removed."""
    g = model.graph
    removed = 0
    while True:
        used = {i for n in g.node for i in n.input if i} | {o.name for o in g.output}
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    used |= {i for sn in a.g.node for i in sn.input}
        dead = [k for k, n in enumerate(g.node) if n.output and not any(o in used for o in n.output if o)]
        if not dead:
            break
        for k in reversed(dead):
            del g.node[k]
        removed += len(dead)
    used = {i for n in g.node for i in n.input if i} | {o.name for o in g.output} | {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
    vi_keep = [v for v in g.value_info if v.name in used or any(v.name in n.output for n in g.node)]
    del g.value_info[:]
    g.value_info.extend(vi_keep)
    return removed


def _is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               or n.op_type in ("ConvInteger", "MatMulInteger") for n in model.graph.node)


def _load_profile(profile):
    if profile is not None:
        return profile
    from ..npu.profile import load_profile

    return load_profile(None)


@contextlib.contextmanager
def _quiet_onnxruntime():
    """onnxruntime.quantization logs advice on the root logger; route it to nafix's debug log."""

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            path = record.pathname.replace("\\", "/")
            if "onnxruntime/quantization" in path:
                log.debug("onnxruntime.quantization: %s", record.getMessage())
                return False
            return True

    root = logging.getLogger()
    flt = _Filter()
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


class _Graph:
    """Producer/consumer/constant lookups over a ModelProto being edited in place."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.g = model.graph
        self.refresh()

    def refresh(self) -> None:
        g = self.g
        self.inits = {t.name: t for t in g.initializer}
        self.consts = _constants(self.model)
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inputs = {vi.name for vi in g.input if vi.name not in self.inits}
        self.outputs = {vi.name for vi in g.output}
        self.taken = set(self.producer) | set(self.inits) | self.inputs | {n.name for n in g.node}

    def fresh(self, base: str) -> str:
        k = 0
        while True:
            cand = f"{base}__nafix_{k}"
            if cand not in self.taken:
                self.taken.add(cand)
                return cand
            k += 1

    def add_init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        t = numpy_helper.from_array(np.asarray(value), name)
        self.g.initializer.append(t)
        self.inits[name] = t
        self.consts[name] = np.asarray(value)
        return name

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def qparams(self, node: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None]:
        s = self.consts.get(node.input[1]) if len(node.input) > 1 else None
        if len(node.input) > 2 and node.input[2]:
            z = self.consts.get(node.input[2])
        else:
            z = None if s is None else np.zeros(np.shape(s), np.uint8)
        return s, z


_ORIG_SUFFIX = "__nafix_orig"


def _rename_collisions(model: onnx.ModelProto, touched: set[str]) -> dict[str, str]:
    """Rename existing names onnxruntime would generate for ``touched`` tensors (``<t>_QuantizeLinear``,
    ``<t>_scale``, ...), so its new nodes do not clash with the model's; returns {new: old}."""
    g = model.graph
    io = {vi.name for vi in g.input} | {vi.name for vi in g.output}
    prefixes = tuple(t + "_" for t in touched)

    def clashes(name: str) -> bool:
        return bool(name) and name not in io and name.startswith(prefixes)

    mapping: dict[str, str] = {}
    tensors = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for name in sorted(tensors):
        if clashes(name):
            mapping[name] = name + _ORIG_SUFFIX
    _apply_tensor_renames(model, mapping)
    renamed = {v: k for k, v in mapping.items()}
    for n in g.node:
        if clashes(n.name):
            renamed[n.name + _ORIG_SUFFIX] = n.name
            n.name = n.name + _ORIG_SUFFIX
    return renamed


def _apply_tensor_renames(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    if not mapping:
        return
    g = model.graph
    for t in g.initializer:
        if t.name in mapping:
            t.name = mapping[t.name]
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in mapping:
                n.input[k] = mapping[i]
        for k, o in enumerate(n.output):
            if o in mapping:
                n.output[k] = mapping[o]
    for vi in g.value_info:
        if vi.name in mapping:
            vi.name = mapping[vi.name]


def _rename_back(model: onnx.ModelProto, renamed: Mapping[str, str]) -> None:
    """Give renamed tensors and nodes their original names again where nothing took them meanwhile."""
    g = model.graph
    taken_t = {t.name for t in g.initializer} | {o for n in g.node for o in n.output} | {i.name for i in g.input}
    taken_n = {n.name for n in g.node}
    tensor_map = {new: old for new, old in renamed.items() if new in taken_t and old not in taken_t}
    _apply_tensor_renames(model, tensor_map)
    for n in g.node:
        old = renamed.get(n.name)
        if old is not None and old not in taken_n:
            taken_n.discard(n.name)
            n.name = old
            taken_n.add(old)
