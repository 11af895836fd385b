"""Issue 32, item 5: `--quantize` on a model with NaN (or infinite) weights failed with onnxruntime's
`AssertionError: scale issue`. nafix checks the float constants before quantizing and names them:
exit 2, one `error:` line, nothing written."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer.quantize import non_finite_constants
from tests.builders.channels import conv, denoiser_like, gemm
from tests.helpers import run_cli


def _poison(model: onnx.ModelProto, name: str, value: float, count: int = 1) -> onnx.ModelProto:
    for t in model.graph.initializer:
        if t.name == name:
            a = numpy_helper.to_array(t).copy()
            a.reshape(-1)[:count] = value
            t.CopyFrom(numpy_helper.from_array(a, name))
            return model
    raise AssertionError(f"no initializer {name}")


def _run(tmp_path, capsys, model: onnx.ModelProto):
    p = tmp_path / "m.onnx"
    onnx.save(model, str(p))
    out = tmp_path / "out"
    code, _, err = run_cli([p, "--quantize", "-o", f"{out}/"], capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err and "AssertionError" not in err and "scale issue" not in err
    assert not out.exists() or not any(out.iterdir())
    return lines[0]


def test_nan_weights_of_a_float_model_are_named(tmp_path, capsys):
    line = _run(tmp_path, capsys, _poison(conv(cin=4, cout=8), "conv.weight", np.nan, count=3))
    assert "'conv.weight' (3 NaN of 32 values)" in line and "hold NaN" in line and "cannot quantize" in line


def test_an_infinite_bias_is_named_as_inf(tmp_path, capsys):
    line = _run(tmp_path, capsys, _poison(gemm(k=16, n=8), "gemm.bias", -np.inf, count=2))
    assert "'gemm.bias' (2 Inf of 8 values)" in line and "hold Inf" in line


def test_nan_in_a_qdq_model_is_named_too(tmp_path, capsys):
    """A QDQ model's float constants (here a DequantizeLinear scale) are checked before its islands
    are quantized."""
    m = denoiser_like(c=24)
    scale = next(n.input[1] for n in m.graph.node if n.op_type == "DequantizeLinear"
                 and any(t.name == n.input[0] for t in m.graph.initializer))
    line = _run(tmp_path, capsys, _poison(m, scale, np.nan))
    assert f"'{scale}'" in line and "NaN" in line


def test_every_poisoned_constant_is_listed_nan_and_inf_counted_apart():
    m = _poison(_poison(conv(cin=4, cout=8), "conv.weight", np.nan, count=2), "conv.bias", np.inf)
    assert non_finite_constants(m) == [("conv.weight", 2, 0, 32), ("conv.bias", 0, 1, 8)]


def test_a_constant_node_and_a_subgraph_constant_are_checked():
    nan = numpy_helper.from_array(np.array([1.0, np.nan], np.float32), "c")
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=nan)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.array([0.0, 1.0], np.float32), "e"))], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    g = helper.make_graph([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                               np.array([np.nan], np.float32), "k")),
                           helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                          "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert [(n, nan_count) for n, nan_count, _, _ in non_finite_constants(m)] == [("k", 1), ("c", 1)]


def test_minus_infinity_outside_weights_is_left_alone():
    """-inf is a legitimate constant where it is not a weight (an attention mask's): not an error."""
    g = helper.make_graph([helper.make_node("Max", ["x", "floor"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                          initializer=[numpy_helper.from_array(np.full(4, -np.inf, np.float32), "floor")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert non_finite_constants(m) == []
    assert non_finite_constants(_poison(m, "floor", np.nan)) == [("floor", 1, 0, 4)]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16])
def test_other_float_types_are_checked(dtype):
    w = helper.make_tensor("w", dtype, [2, 2], [1.0, float("inf"), float("nan"), 0.0])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert non_finite_constants(m) == [("w", 1, 1, 4)]
