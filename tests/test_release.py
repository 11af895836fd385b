"""An audit keeps only the report data of each model: the graph view is freed by reference counting
at once (no full garbage-collector pass needed), and the report row is unchanged."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fixer.api import AnalysisOptions, AuditOptions, analyze_path, audit
from fixer.report_data import analysis_dict


def _model(path):
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_released_analysis_frees_the_graph_without_the_cyclic_collector(tmp_path):
    a = analyze_path(_model(tmp_path / "m.onnx"), AnalysisOptions())
    row = analysis_dict(a)
    node = weakref.ref(a.view.nodes[0])
    gc.disable()
    try:
        light = a.released()
        del a
        assert node() is None  # freed by reference counting alone
    finally:
        gc.enable()
    assert light.view is None and light.loaded.model is None
    assert analysis_dict(light) == row


def test_audit_rows_hold_released_analyses_with_the_same_report(tmp_path):
    path = _model(tmp_path / "m.onnx")
    full = analysis_dict(analyze_path(path, AnalysisOptions()))
    (m,) = audit([path], AuditOptions()).models
    assert m.error is None and m.analysis.view is None and m.analysis.loaded.model is None
    assert analysis_dict(m.analysis) == full
