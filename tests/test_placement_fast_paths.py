"""Placement and estimate fast paths against the plain code they replace, on every shared and sample
model: the constant-derived nodes (view.is_const inline), the weight bytes (each constant's type and
shape read once) and the epoch estimate reading the quantization domain's activation lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fixer import ir
from fixer.api import AnalysisOptions, resolve_profile
from fixer.graph import QDQ_OPS, GraphView
from fixer.model_io import load_model
from fixer.npu import memory, placement
from fixer.npu.estimate import estimate_epochs

ROOT = Path(__file__).resolve().parents[1]
MODELS = sorted((ROOT.parent / "shared" / "models").glob("*.onnx")) + sorted((ROOT / "sample_models").glob("*.onnx"))


def _const_derived_reference(view: GraphView) -> frozenset[str]:
    out: set[str] = set()
    derived: set[str] = set()
    for node in view.nodes:
        ins = [t for t in node.inputs if t.name]
        if not ins:
            continue
        if all(isinstance(t, ir.Constant) or t.name in derived or view.is_const(t) for t in ins):
            derived.update(o.name for o in node.outputs)
            if node.op not in QDQ_OPS or any(t.name in derived for t in ins):
                out.add(node.name)
    return frozenset(out)


def _weights_bytes_reference(view: GraphView) -> int:
    seen: set[str] = set()
    total = 0
    for node in view.nodes:
        for i, t in enumerate(node.inputs):
            if not isinstance(t, ir.Constant) or t.name in seen:
                continue
            if node.op in QDQ_OPS and i > 0:
                continue
            if t.dtype == np.int64 or t.size <= 1 and node.op not in QDQ_OPS:
                continue
            seen.add(t.name)
            total += t.nbytes
    return total


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_fast_paths_equal_the_plain_code(path):
    view = GraphView(load_model(path).model)
    assert placement._const_derived(view) == _const_derived_reference(view)
    assert memory.weights_bytes(view) == _weights_bytes_reference(view)
    profile = resolve_profile(AnalysisOptions())
    domain = placement.quant_domain(view, profile)
    placed = placement.place(view, profile, domain=domain)
    assert estimate_epochs(view, placed, profile, domain=domain) == estimate_epochs(view, placed, profile)


def test_weights_bytes_of_decoded_and_undecoded_constants_agree():
    """A constant whose values were decoded counts the same bytes as one read from its proto."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.ones((4,), np.int32), "b")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[w, b])
    view = GraphView(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    lazy = memory.weights_bytes(view)
    for t in view.nodes[0].inputs:
        if isinstance(t, ir.Constant):
            t.values  # noqa: B018 - decode
    assert lazy == memory.weights_bytes(view) == _weights_bytes_reference(view) == 4 * 27 * 4 + 4 * 4
