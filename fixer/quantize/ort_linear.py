"""Linear-time adapters around onnxruntime's quantization helpers that are quadratic in the node count.

onnxruntime's ``quantize_static`` chooses the scales and zero-points; nafix does not change that.
What is slow on large graphs (an unrolled recurrent model has 10-40 thousand nodes) is bookkeeping
that rescans the whole graph once per tensor:

* ``MinMaxCalibrater.augment_graph`` rebuilds a name -> value_info dict and searches the node list
  for the insertion point once per calibrated tensor (``add_reduce_min_max``);
* ``ONNXModel.replace_input_of_all_nodes`` / ``replace_output_of_all_nodes`` visit every node
  once per quantized tensor, and ``input_name_to_nodes`` rebuilds a dict of the whole graph for
  each one-tensor question (``try_replacing_upstream_output``, ``adjust_tensor_ranges``);
* ``ONNXModel.get_initializer`` / ``add_initializer`` / ``remove_initializer`` and
  ``quant_utils.find_by_name`` on the initializer list scan every initializer once per lookup, and
  ``initializer_extend`` re-checks every initializer once per bias.

:func:`linear_time_quantization` swaps these for versions backed by indexes, for the duration of a
``with`` block, and restores the originals on exit (also on error). Equivalence argument, per helper:

* ``augment_graph``: the same ReduceMin/ReduceMax -> Reshape pairs, with the same names, attributes
  and graph outputs in the same order, inserted at the same positions. onnxruntime inserts a
  tensor's pair before the first node reading the tensor; since a pair only reads its own tensor,
  that node is the tensor's first original consumer (the ReduceMin pair), and the ReduceMax pair then
  goes right before the ReduceMin pair. Pairs of tensors with the same first consumer stay in
  calibration order; tensors nobody reads get theirs appended at the end. The adapter computes each
  first consumer once and emits the same sequence, so the augmented model is the same graph (only the
  random uuid names of the helper initializers differ, as they do between two onnxruntime runs).
* ``replace_input_of_all_nodes(old, new)`` (and the output twin): renames ``old`` to ``new`` in the
  inputs of the nodes that read ``old``. The adapter keeps tensor -> readers and tensor -> writers
  indexes, extended with nodes appended since the last call and rebuilt when nodes were removed or
  an input/output was rewritten through another ``ONNXModel`` method; it visits exactly the readers
  of ``old`` instead of every node. ``input_name_to_nodes()`` answers from the same index with the
  same lists (one entry per input slot, in graph order). In the QDQ format onnxruntime changes
  node inputs only through ``ONNXModel`` methods (the direct ``node.input[...]`` writes are in the
  QOperator-format operators), so the index cannot miss a reader; nafix uses these adapters for
  QDQ quantization only.
* initializer lookups return the first initializer with the name, as the scans do, from a
  name -> initializers index kept in step with appends and removals; ``initializer_extend``
  re-checks only the float8 initializers, the only ones ``ONNXModel._check_init`` inspects.

Results are therefore identical, which ``tests/test_ort_linear.py`` checks against unpatched
onnxruntime (scales, zero-points, the whole quantized graph). Each adapter is a drop-in for one
onnxruntime helper and could replace it upstream.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
import weakref
from collections.abc import Mapping
from typing import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

_ATTR = "_nafix_linear_index"


class _Index:
    """Per-model indexes kept in step with the edits onnxruntime's QDQ quantizer makes.

    Nodes are only appended between two calls (``add_node``), so each index reads the nodes and
    initializers added since its last call; any other change of the node list (removal) or of node
    inputs/outputs made outside the indexed methods drops the affected index, rebuilt on next use.
    """

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.invalidate_nodes()
        self.invalidate_inits()

    # -- nodes: readers (per input occurrence, in graph order) and writers ------------------------
    def invalidate_nodes(self) -> None:
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        self.writers: dict[str, list[onnx.NodeProto]] = {}
        self.order: dict[int, int] = {}  # id(node) -> position when indexed (appends only)
        self.nodes_seen = 0

    def sync_nodes(self) -> None:
        nodes = self.model.graph.node
        if len(nodes) < self.nodes_seen:
            self.invalidate_nodes()
        for i in range(self.nodes_seen, len(nodes)):
            node = nodes[i]
            self.order[id(node)] = i
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)
            for name in node.output:
                if name:
                    self.writers.setdefault(name, []).append(node)
        self.nodes_seen = len(nodes)

    def _rename(self, table: dict, field: str, old: str, new: str) -> None:
        self.sync_nodes()
        moved = []
        done: set[int] = set()
        for node in table.pop(old, []):
            if id(node) in done:
                continue
            done.add(id(node))
            names = getattr(node, field)
            for j in range(len(names)):
                if names[j] == old:
                    names[j] = new
                    moved.append(node)
        if moved and new:
            merged = table.get(new, []) + moved
            merged.sort(key=lambda n: self.order.get(id(n), 0))  # graph order, as a scan finds them
            table[new] = merged

    def replace_input(self, old: str, new: str) -> None:
        self._rename(self.readers, "input", old, new)

    def replace_output(self, old: str, new: str) -> None:
        self._rename(self.writers, "output", old, new)

    def readers_of(self, name: str) -> list[onnx.NodeProto] | None:
        self.sync_nodes()
        found = self.readers.get(name)
        return list(found) if found else None

    # -- initializers: name -> initializers with that name, in list order -------------------------
    def invalidate_inits(self) -> None:
        self.inits: dict[str, list[onnx.TensorProto]] = {}
        self.float8: list[onnx.TensorProto] = []
        self.inits_seen = 0

    def sync_inits(self) -> None:
        inits = self.model.graph.initializer
        if len(inits) < self.inits_seen:
            self.invalidate_inits()
        for i in range(self.inits_seen, len(inits)):
            t = inits[i]
            self.inits.setdefault(t.name, []).append(t)
            if t.data_type == onnx.TensorProto.FLOAT8E4M3FN:
                self.float8.append(t)
        self.inits_seen = len(inits)

    def initializer(self, name: str) -> onnx.TensorProto | None:
        self.sync_inits()
        found = self.inits.get(name)
        if not found:
            return None
        if found[0].name != name:  # renamed in place after indexing: read the list again
            self.invalidate_inits()
            return self.initializer(name)
        return found[0]

    def removed_initializer(self, tensor: onnx.TensorProto) -> None:
        """``tensor`` (indexed before) has just been removed from the initializer list."""
        same = self.inits.get(tensor.name, [])
        for k, t in enumerate(same):
            if t is tensor:
                del same[k]
                self.inits_seen -= 1
                if tensor in self.float8:
                    self.float8.remove(tensor)
                return
        self.invalidate_inits()


def _index(onnx_model) -> _Index:
    idx = onnx_model.__dict__.get(_ATTR)
    if idx is None or idx.model is not onnx_model.model:
        idx = _Index(onnx_model.model)
        onnx_model.__dict__[_ATTR] = idx
    return idx


def _linear_augment_graph(self) -> None:
    """``MinMaxCalibrater.augment_graph`` with one pass for insertion points and value_infos."""
    tensors, value_infos = self.select_tensors_to_calibrate(self.model)
    graph = self.model.graph
    reshape_shape_name = str(uuid.uuid4())
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), reshape_shape_name))
    # the lookups onnxruntime rebuilds per tensor: value_info, then outputs, then inputs win
    infos = {vi.name: vi for vi in graph.value_info}
    infos.update({o.name: o for o in graph.output})
    infos.update({i.name: i for i in graph.input})
    first_reader: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            first_reader.setdefault(name, i)

    def op_version(op_type: str) -> int:
        for imp in self.model.opset_import:
            if onnx.defs.has(op_type, imp.domain):
                return imp.version
        raise RuntimeError(f"Model does not contain a version for '{op_type}'.")

    def pair(tensor_name: str, reduce_op: str) -> list[onnx.NodeProto]:
        reduce_output = tensor_name + "_" + reduce_op
        intermediate = reduce_output + "_Reshape"
        reduce_node = helper.make_node(reduce_op, [tensor_name], [intermediate], keepdims=1, name=reduce_output)
        reshape_node = helper.make_node("Reshape", inputs=[intermediate, reshape_shape_name],
                                        outputs=[reduce_output], name=intermediate)
        if tensor_name not in infos:
            raise ValueError(f"Unable to guess tensor type for tensor {tensor_name!r}, "
                             "running shape inference before quantization may resolve this issue.")
        vi = infos[tensor_name]
        if self.per_channel:
            rank = len(vi.type.tensor_type.shape.dim)
            axes = [0, *range(2, rank)]
            if op_version(reduce_op) < 18:
                reduce_node.attribute.append(helper.make_attribute("axes", axes))
            else:
                axes_name = str(uuid.uuid4())
                reduce_node.input.append(axes_name)
                graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
        graph.output.append(helper.make_tensor_value_info(reduce_output, vi.type.tensor_type.elem_type, [None]))
        return [reduce_node, reshape_node]

    before: dict[int, list[onnx.NodeProto]] = {}
    tail: list[onnx.NodeProto] = []
    for tensor in tensors:
        mins = pair(tensor, "ReduceMin")
        maxs = pair(tensor, "ReduceMax")
        # onnxruntime: ReduceMin pair before the first reader, then ReduceMax pair before ReduceMin
        at = first_reader.get(tensor)
        (tail if at is None else before.setdefault(at, [])).extend(maxs + mins)
    if before or tail:
        old = list(graph.node)
        new_nodes = []
        for i, node in enumerate(old):
            new_nodes.extend(before.get(i, ()))
            new_nodes.append(node)
        new_nodes.extend(tail)
        del graph.node[:]
        graph.node.extend(new_nodes)
    onnx.save(self.model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)


def _patched_methods():
    from onnxruntime.quantization.onnx_model import ONNXModel

    orig_init = ONNXModel.__init__
    orig_replace_node_input = ONNXModel.__dict__["replace_node_input"]
    orig_replace_node_output = ONNXModel.__dict__["replace_node_output"]
    orig_replace_input_of_nodes = ONNXModel.replace_input_of_nodes
    orig_replace_output_of_nodes = ONNXModel.replace_output_of_nodes
    orig_remove_node = ONNXModel.remove_node
    orig_clean = ONNXModel.clean_initializers
    live: "weakref.WeakSet" = weakref.WeakSet()

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        live.add(self)  # find_by_name recognises this model's initializer list

    def replace_input_of_all_nodes(self, old_input_name, new_input_name):
        _index(self).replace_input(old_input_name, new_input_name)

    def replace_output_of_all_nodes(self, old_output_name, new_output_name):
        _index(self).replace_output(old_output_name, new_output_name)

    def input_name_to_nodes(self):
        return _Readers(_index(self), self)

    def replace_input_of_nodes(self, old_input_name, new_input_name, node_names_set):
        orig_replace_input_of_nodes(self, old_input_name, new_input_name, node_names_set)
        _index(self).invalidate_nodes()  # rare (bias, converted types): re-read on next use

    def replace_output_of_nodes(self, old_output_name, new_output_name, node_names_set):
        orig_replace_output_of_nodes(self, old_output_name, new_output_name, node_names_set)
        _index(self).invalidate_nodes()

    def replace_node_input(node, old_input_name, new_input_name):
        orig_replace_node_input.__func__(node, old_input_name, new_input_name)
        for model in list(live):  # which model the node is in is unknown: a handful at most
            _index(model).invalidate_nodes()

    def replace_node_output(node, old_output_name, new_output_name):
        orig_replace_node_output.__func__(node, old_output_name, new_output_name)
        for model in list(live):
            _index(model).invalidate_nodes()

    def remove_node(self, node):
        orig_remove_node(self, node)
        _index(self).invalidate_nodes()

    def get_initializer(self, name):
        return _index(self).initializer(name)

    def add_initializer(self, tensor):
        if _index(self).initializer(tensor.name) is None:
            self._check_init(tensor)
            self.model.graph.initializer.extend([tensor])

    def initializer_extend(self, inits):
        if len(inits) == 0:
            raise ValueError("Can add an empty list.")
        idx = _index(self)
        idx.sync_inits()
        # onnxruntime re-checks every existing initializer; _check_init only inspects float8 ones
        for init in list(idx.float8):
            self._check_init(init, "gain")
        for init in inits:
            self._check_init(init)
            self.model.graph.initializer.append(init)

    def remove_initializer(self, tensor):
        idx = _index(self)
        idx.sync_inits()
        if idx.initializer(tensor.name) is None:
            return  # not in the list (onnxruntime's `tensor in initializer` test)
        inits = self.model.graph.initializer
        try:
            inits.remove(tensor)
        except ValueError:  # no equal initializer: onnxruntime's `in` test would have said so
            return
        idx.removed_initializer(tensor)
        for graph_input in self.model.graph.input:
            if graph_input.name == tensor.name:
                self.model.graph.input.remove(graph_input)
                break

    def clean_initializers(self):
        try:
            return orig_clean(self)
        finally:
            _index(self).invalidate_inits()
            _index(self).invalidate_nodes()

    return ONNXModel, {
        "__init__": __init__,
        "replace_input_of_all_nodes": replace_input_of_all_nodes,
        "replace_output_of_all_nodes": replace_output_of_all_nodes,
        "input_name_to_nodes": input_name_to_nodes,
        "replace_input_of_nodes": replace_input_of_nodes,
        "replace_output_of_nodes": replace_output_of_nodes,
        "replace_node_input": staticmethod(replace_node_input),
        "replace_node_output": staticmethod(replace_node_output),
        "remove_node": remove_node,
        "get_initializer": get_initializer,
        "add_initializer": add_initializer,
        "initializer_extend": initializer_extend,
        "remove_initializer": remove_initializer,
        "clean_initializers": clean_initializers,
    }, live


class _Readers(Mapping):
    """What ``ONNXModel.input_name_to_nodes()`` returns (tensor -> reading nodes, one entry per
    input slot, in graph order), answered from the index: lookups cost the readers of one tensor.
    Iterating it (rare) builds onnxruntime's dict."""

    def __init__(self, index: _Index, onnx_model):
        self._index = index
        self._model = onnx_model
        self._full: dict | None = None

    def __getitem__(self, name):
        found = self._index.readers_of(name) if name else None
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name):
        return bool(name) and self._index.readers_of(name) is not None

    def _dict(self) -> dict:
        if self._full is None:
            self._full = {}
            for node in self._model.model.graph.node:
                for name in node.input:
                    if name:
                        self._full.setdefault(name, []).append(node)
        return self._full

    def __iter__(self):
        return iter(self._dict())

    def __len__(self):
        return len(self._dict())


def _find_by_name_factory(original, live):
    def find_by_name(item_name, item_list):
        # the initializer list of a model onnxruntime's quantizer is working on: indexed lookup
        for model in list(live):
            if item_list is model.model.graph.initializer:
                return _index(model).initializer(item_name)
        return original(item_name, item_list)

    return find_by_name


@contextlib.contextmanager
def linear_time_quantization() -> Iterator[None]:
    """Within the block, onnxruntime's QDQ quantization uses the linear-time adapters of this module.

    Restores every patched attribute on exit. Not thread-safe (it patches classes and modules, like
    any monkeypatch); nafix quantizes one model at a time.
    """
    from onnxruntime.quantization import calibrate, quant_utils

    onnx_model_cls, methods, live = _patched_methods()
    saved: list[tuple[object, str, object]] = []

    def patch(owner, name, value):
        saved.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, value)

    try:
        patch(calibrate.MinMaxCalibrater, "augment_graph", _linear_augment_graph)
        for name, fn in methods.items():
            patch(onnx_model_cls, name, fn)
        original_find = quant_utils.find_by_name
        fast_find = _find_by_name_factory(original_find, live)
        for mod_name, mod in list(sys.modules.items()):
            if mod_name.startswith("onnxruntime.quantization") and getattr(mod, "find_by_name", None) is original_find:
                patch(mod, "find_by_name", fast_find)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        for model in list(live):
            model.__dict__.pop(_ATTR, None)
