"""What stays at the level of a raw ``onnx.ModelProto`` because onnxruntime's quantizer takes and
returns one: node names and initializer inputs made ready for it, its metadata keys, the IR version
clamp, and the renames around the names it generates. Reading or editing a graph's structure goes
through :mod:`fixer.ir` and :mod:`fixer.graph`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

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


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _unique_names(model: onnx.ModelProto) -> int:
    """Give every node of a model about to go to onnxruntime a unique name (its node lists and nafix's
    placement use them), by the rule of :func:`fixer.graph.unique_node_names`; returns how many
    were renamed."""
    from ..graph import ProtoNode, unique_node_names

    return unique_node_names([ProtoNode(n) for n in model.graph.node])


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


def _export(graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """The model of nafix graph ``graph`` (:func:`fixer.ir.export_onnx`) with every model-level field
    of ``template`` (IR version, opsets, producer, metadata, functions, ...) as ``template`` has it,
    set or unset alike: the file is the one an in-place edit of ``template`` would have written."""
    from .. import ir

    out = ir.export_onnx(graph)
    for fd in out.DESCRIPTOR.fields:
        if fd.name != "graph":
            out.ClearField(fd.name)
    ir.copy_fields(template, out, skip={"graph"})
    return out


def _keep_initializer_order(model: onnx.ModelProto, order: Sequence[str]) -> None:
    """Put ``model``'s initializers in ``order`` (the order of the model it was exported from, then
    the constants made since), as the protobuf edits nafix used to do left them: an export writes
    them in first-use order, which changes the file, not the model. Names not in ``order`` go last."""
    rank = {name: i for i, name in enumerate(order)}
    last = len(rank)
    model.graph.initializer.sort(key=lambda t: rank.get(t.name, last))  # stable: new ones keep their order


def _clamp_ir(model: onnx.ModelProto) -> None:
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION


def _drop_ort_metadata(model: onnx.ModelProto) -> None:
    keep = [(p.key, p.value) for p in model.metadata_props if p.key not in _ORT_METADATA_KEYS]
    del model.metadata_props[:]
    for k, v in keep:
        model.metadata_props.add(key=k, value=v)


def _is_quantized(model: onnx.ModelProto) -> bool:
    """:func:`fixer.graph.is_quantized`, or an integer op (ConvInteger, MatMulInteger): what
    onnxruntime quantization must not be run on again (not the same question: a model with only
    integer ops is float to the NPU's placement)."""
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
