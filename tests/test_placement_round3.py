"""Placement facts of issue 34 (real pairs added in round 3), each on a model built here: the compiler's
fusions (HardSigmoid into its Conv), Q/DQ around SW ops (QDQ pairs vs QOperator's lone conversions), the
core-specific Slice/Concat facts, the names and epochs of SW linear ops, and report versions in the
X-CUBE-AI pack's numbering."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from fixer.calibrate import _known_core, calibrate, core_of
from fixer.npu.profile import load_profile
from tests.helpers import QDQ, analyze


def core(version: str, options=()):
    return load_profile(options=frozenset(options), core=version)


# ------------------------------------------------------------------------------ versions


def test_pack_numbered_version_is_read_as_its_core():
    # 'ST Edge AI Core v10.0.0-20047': a build older than 2.0.0-20049 that printed the X-CUBE-AI pack number
    assert core_of("10.0.0-20047") == "2.0.0"
    assert core_of("v10.2.0") == "2.2.0"
    assert core_of("2.1.0-20194") == "2.1.0" and core_of("4.0.1") == "4.0.1"
    assert _known_core("2.0.0", None) and not _known_core("7.3.0", None)


def _gemm_pair(folder, version: str):
    folder.mkdir(parents=True)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 1])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    g = helper.make_graph([helper.make_node("Gemm", ["a", "b"], ["y"], name="Gemm_2")], "mm", [a, b], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)]), folder / "model.onnx")
    (folder / "report.txt").write_text(
        f"ST Edge AI Core {version} 329b0e98d\n"
        "Total number of epochs: 3 of which 1 implemented in software\n\n"
        "epoch ID   HW/SW/EC Operation (SW only)\n"
        "epoch 1       HW\nepoch 2      -SW-   (        Conv        )\nepoch 3       HW\n")


def test_calibrate_reads_the_pack_version_and_names_unknown_ones(tmp_path):
    _gemm_pair(tmp_path / "pairs" / "old", "v10.0.0-20047")
    _gemm_pair(tmp_path / "pairs" / "odd", "v7.3.0-1")
    rows = {r.pair: r for r in calibrate(tmp_path / "pairs")}
    old = rows["old"]
    assert old.core == "2.0.0" and old.estimated
    # a float activation x activation Gemm: a SW 'Conv' between two HW reshape epochs (matmul_float_OE)
    assert (old.est_epochs, old.est_sw, dict(old.est_sw_ops)) == (3, 1, {"Conv": 1}) and not old.failures()
    odd = rows["odd"]
    assert not odd.estimated and odd.status == "unknown core"
    assert "7.3.0" in odd.note and "2.0, 2.1, 2.2, 3.0, 4.0" in odd.note


# ------------------------------------------------------------------------------ fusions and Q/DQ


def _conv_then(act: str, *, after_conv: bool = True, **attrs):
    b = QDQ()
    x = b.input("x", [1, 8, 1, 1])
    src = b.op("Conv", [x, b.weight("w", [8, 8, 1, 1]), b.bias("bias", 8)], name="conv") if after_conv else x
    y = b.op(act, [src], name="act", **attrs)
    b.output(y)
    return b.model()


def test_hardsigmoid_after_conv_is_fused_into_its_epoch():
    a = analyze(_conv_then("HardSigmoid", alpha=0.2, beta=0.5), prof=core("2.2"))
    assert a.placement.by_name["act"].unit == "HW"
    assert a.estimate.sw_epochs == 0
    assert [g.nodes for g in a.estimate.groups if "conv" in g.nodes] == [["conv", "act"]]
    # Q/DQ between them fold
    assert all(p.unit != "SW" for p in a.placement.nodes)


def test_hardsigmoid_not_after_a_conv_stays_sw():
    a = analyze(_conv_then("HardSigmoid", after_conv=False), prof=core("2.2"))
    p = a.placement.by_name["act"]
    assert p.unit == "SW" and [r.constraint for r in p.reasons] == ["fused_into_conv"]
    assert "'act' follows a graph input" in p.reasons[0].detail


def _qoperator_prelu() -> onnx.ModelProto:
    """QLinearConv -> DequantizeLinear -> PRelu (float slope) -> QuantizeLinear -> QLinearConv (QOperator)."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.ones((4, 4, 1, 1), np.int8), "w"),
             numpy_helper.from_array(np.full(4, 0.01, np.float32), "ws"), numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
             numpy_helper.from_array(np.full((4, 1, 1), 0.25, np.float32), "slope")]
    nodes = [
        helper.make_node("QLinearConv", ["x", "s", "z", "w", "ws", "wz", "s", "z"], ["c1"], name="conv1"),
        helper.make_node("DequantizeLinear", ["c1", "s", "z"], ["c1_f"], name="dq"),
        helper.make_node("PRelu", ["c1_f", "slope"], ["p"], name="prelu"),
        helper.make_node("QuantizeLinear", ["p", "s", "z"], ["p_q"], name="q"),
        helper.make_node("QLinearConv", ["p_q", "s", "z", "w", "ws", "wz", "s", "z"], ["y"], name="conv2"),
    ]
    g = helper.make_graph(nodes, "qop", [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 4, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 4, 4, 4])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(m)


def _qdq_prelu() -> onnx.ModelProto:
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [4, 4, 1, 1]), b.bias("bias", 4)], name="conv1")
    p = b.op("PRelu", [c, b.const("slope", np.full((4, 1, 1), 0.25, np.float32))], name="prelu")
    y = b.op("Conv", [p, b.weight("w2", [4, 4, 1, 1]), b.bias("bias2", 4)], name="conv2")
    b.output(y)
    return b.model()


def test_float_slope_prelu_between_qdq_pairs_is_one_int8_sw_epoch():
    a = analyze(_qdq_prelu(), prof=core("2.1"))
    assert a.placement.by_name["prelu"].kernel == "int8"
    assert a.estimate.sw_ops == Counter({"PRelu": 1})


def test_float_slope_prelu_after_a_qlinearconv_is_a_float_island():
    a = analyze(_qoperator_prelu(), prof=core("2.1"))
    pl = a.placement.by_name
    assert pl["prelu"].unit == "SW" and pl["prelu"].kernel == "float"
    assert pl["dq"].unit == "SW" and pl["q"].unit == "SW"
    assert a.estimate.sw_ops == Counter({"DequantizeLinear": 1, "PRelu": 1, "QuantizeLinear": 1})


def _standalone_bn(quantized_scale: bool) -> onnx.ModelProto:
    b = QDQ()
    x = b.input("x", [1, 4, 8, 8])
    r = b.op("Relu", [x], name="relu")
    scale = b.qconst("bn_scale", np.full(4, 20, np.int8)) if quantized_scale else b.const(
        "bn_scale", np.ones(4, np.float32))
    params = [b.const("bn_b", np.zeros(4, np.float32)), b.const("bn_mean", np.zeros(4, np.float32)),
              b.const("bn_var", np.ones(4, np.float32))]
    y = b.op("BatchNormalization", [r, scale, *params], name="bn")
    b.output(y)
    return b.model()


def test_standalone_batchnorm_with_a_quantized_scale_runs_on_the_npu():
    # PP-OCRv4 det (2.2): Mul + Add inserted on HW; a float scale (SFace, 2.1) keeps it SW
    assert analyze(_standalone_bn(True), prof=core("2.2")).placement.by_name["bn"].unit == "HW"
    p = analyze(_standalone_bn(False), prof=core("2.2")).placement.by_name["bn"]
    assert p.unit == "SW" and "batchnorm_folded" in [r.constraint for r in p.reasons]


def test_requantizing_a_float_sw_op_costs_one_quantize_per_reader():
    b = QDQ()
    x = b.input("x", [1, 2, 8])
    s = b.op("Sub", [b.const("k", np.ones((1, 2, 8), np.float32)), x], name="sub")  # constant first: SW float
    y1 = b.op("Add", [s, x], name="add")
    y2 = b.op("Sub", [x, s], name="sub2")
    b.output(y1, "y1")
    b.output(y2, "y2")
    a = analyze(b.model(), prof=core("4.0"))
    assert a.estimate.sw_ops == Counter({"DequantizeLinear": 1, "Sub(float)": 1, "QuantizeLinear": 2})


# ------------------------------------------------------------------------------ Slice, Concat, GDConv per core


def _rank3_slice():
    b = QDQ()
    x = b.input("x", [1, 4, 16])
    y = b.op("Slice", [x, b.const("st", np.array([0], np.int64)), b.const("en", np.array([2], np.int64)),
                       b.const("ax", np.array([1], np.int64))], name="slice")
    b.output(y)
    return b.model()


def test_rank3_channel_slice_is_sw_in_2_0_and_2_1_only():
    # steel_yolov8n (2.0) and yolov8n pose (2.1): SW; yolov11n (4.0.1): no SW or hybrid epoch
    assert analyze(_rank3_slice(), prof=core("2.1")).estimate.sw_ops == Counter({"Slice": 1})
    assert analyze(_rank3_slice(), prof=core("2.0")).estimate.sw_ops == Counter({"Slice": 1})
    a = analyze(_rank3_slice(), prof=core("4.0"))
    assert a.estimate.sw_epochs == 0 and a.estimate.hybrid_epochs == 0


def _concat(widths):
    b = QDQ()
    xs = [b.input(f"x{i}", [1, w, 4, 4]) for i, w in enumerate(widths)]
    y = b.op("Concat", xs, name="cat", axis=1)
    b.output(y)
    return b.model()


def test_unequal_width_concat_is_hybrid_in_4_0_and_on_the_npu_in_3_0():
    assert analyze(_concat([8, 4]), prof=core("4.0")).estimate.hybrid_ops == Counter({"Concat": 1})
    assert analyze(_concat([8, 8]), prof=core("4.0")).estimate.hybrid_epochs == 0
    a = analyze(_concat([8, 4]), prof=core("3.0"))
    assert a.estimate.sw_epochs == 0 and a.estimate.hybrid_epochs == 0


def _gdconv(kh: int, kw: int):
    b = QDQ()
    x = b.input("x", [1, 16, kh, kw])
    y = b.op("Conv", [x, b.weight("w", [16, 1, kh, kw]), b.bias("bias", 16)], name="gdconv", group=16,
             kernel_shape=[kh, kw])
    b.output(y)
    return b.model()


def test_global_depthwise_conv_goes_sw_only_when_wider_than_native():
    # MobileFaceNet: 7x7 GDConv -> 3 x (DQ, Conv, Cast) SW; the per-channel one's 7x6 GDConv ran as HW sub-masks
    assert analyze(_gdconv(7, 7), prof=core("2.1")).estimate.sw_ops == Counter(
        {"DequantizeLinear": 3, "Conv": 3, "Cast": 3})
    a = analyze(_gdconv(7, 6), prof=core("2.1"))
    assert a.estimate.sw_epochs == 0
    assert len([g for g in a.estimate.groups if g.nodes == ["gdconv"]]) == 2  # the sub-mask copy + the conv
