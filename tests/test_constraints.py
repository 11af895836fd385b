"""NPU constraints: boundary tables (passes at the limit, fails just past it) with the reason text.

Every failing case asserts the requirement sentence exactly as the live profile formats it, the
number from the profile inside it, and the observed detail naming the node in quotes.
"""

from __future__ import annotations

import re
import string

import numpy as np
import pytest

from fixer.npu.constraints import GENERIC, HAZARDS, REGISTRY, SEVERITIES, channel_split_ok
from fixer.npu.profile import TAGS
from tests.helpers import (
    QDQ,
    UINT8,
    analyze,
    float_model,
    place_node,
    profile,
    profile_with_limits,
    qdq_op,
    reason,
)


def requirement(cid: str, prof=None) -> str:
    return REGISTRY[cid].requirement((prof or profile()).values())


def assert_hw(p):
    assert p.unit == "HW", f"{p.name} expected HW, got {p.unit}: {[r.text() for r in p.reasons]}"
    assert p.reasons == ()


def assert_sw(p, cid: str, *, detail: str | None = None, contains: tuple[str, ...] = (), prof=None):
    """``p`` runs in SW, ``cid`` is among its reasons with the live requirement sentence."""
    assert p.unit == "SW", f"{p.name} expected SW, got {p.unit}"
    r = reason(p, cid)
    assert r.requirement == requirement(cid, prof)
    assert "{" not in r.requirement and "}" not in r.requirement
    assert f"'{p.name}'" in r.detail, r.detail
    if detail is not None:
        assert detail in r.detail, r.detail
    for c in contains:
        assert c in r.requirement, r.requirement
    # the user-facing line carries requirement, detail and provenance tag
    assert r.text() == f"{r.requirement} ({r.detail}) [{r.tag}]"
    return r


def assert_finding(p, cid: str, severity: str, *, detail: str | None = None, contains: tuple[str, ...] = ()):
    """A compile error or hazard: the node is placed as if it were fixed (no SW reason), and the
    constraint is among its notes with the live requirement sentence and the given severity."""
    assert cid not in [r.constraint for r in p.reasons], f"{p.name}: {cid} must not make it SW"
    (r,) = [r for r in p.notes if r.constraint == cid]
    assert r.severity == severity and r.requirement == requirement(cid)
    assert f"'{p.name}'" in r.detail, r.detail
    if detail is not None:
        assert detail in r.detail, r.detail
    for c in contains:
        assert c in r.requirement, r.requirement
    return r


# ---------------------------------------------------------------------------------------------
# awkward_output_channels
# ---------------------------------------------------------------------------------------------

# (channels, runs in HW?)  - the limit is channel_chunk_max = 144 (INF) in the built-in profile
CHANNEL_TABLE = [
    (139, True),    # prime, but fits one chunk
    (144, True),    # at the limit
    (145, True),    # 5 x 29: chunks of 29
    (149, False),   # prime just past the limit
    (257, False),   # the forum denoiser's count
    (258, True),    # 2 x 129
    (288, True),    # 2 x 144
    (1001, True),   # 7 x 11 x 13
    (302, True),    # 2 x 151: 151 equal chunks of 2 channels satisfy "equal chunks of at most 144"
    (22201, False),  # 149 x 149: every divisor but 1 is > 144
]


def conv_model(c: int):
    return qdq_op("Conv", [[1, 8, 1, 1]], weights={"w": [c, 8, 1, 1]}, name="conv")


def gemm_model(c: int, trans_b: int):
    shape = [c, 8] if trans_b else [8, c]
    return qdq_op("Gemm", [[1, 8]], weights={"w": shape}, weight_axis=0 if trans_b else 1, name="gemm",
                  transB=trans_b)


def matmul_model(c: int):
    return qdq_op("MatMul", [[1, 8]], weights={"w": [8, c]}, weight_axis=1, name="matmul")


def convtranspose_model(c: int, group: int = 1):
    return qdq_op("ConvTranspose", [[1, 8, 1, 1]], weights={"w": [8, c // group, 1, 1]}, weight_axis=1,
                  name="convt", group=group)


BUILDERS = {
    "Conv": ("conv", conv_model),
    "Gemm transB=0": ("gemm", lambda c: gemm_model(c, 0)),
    "Gemm transB=1": ("gemm", lambda c: gemm_model(c, 1)),
    "MatMul": ("matmul", matmul_model),
    "ConvTranspose": ("convt", convtranspose_model),
}


@pytest.mark.parametrize("channels,hw", CHANNEL_TABLE, ids=[str(c) for c, _ in CHANNEL_TABLE])
def test_awkward_output_channels_conv_table(channels, hw):
    p = place_node(conv_model(channels), "conv")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "awkward_output_channels",
                  detail=f"has {channels} output channels, which has no divisor giving chunks <= 144",
                  contains=("at most 144", "equal chunks of at most 144"))
        assert reason(p, "awkward_output_channels").tag == "INF"


@pytest.mark.parametrize("op", [k for k in BUILDERS if k != "Conv"])
@pytest.mark.parametrize("channels,hw", [(144, True), (149, False), (257, False), (258, True)])
def test_awkward_output_channels_other_ops(op, channels, hw):
    node, build = BUILDERS[op]
    p = place_node(build(channels), node)
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "awkward_output_channels", detail=f"has {channels} output channels", contains=("at most 144",))


@pytest.mark.parametrize("group,per_group,hw", [(2, 72, True), (2, 129, True), (1, 257, False)])
def test_awkward_output_channels_convtranspose_counts_groups(group, per_group, hw):
    # ConvTranspose weight is [C_in, C_out / group, kH, kW]: output channels = shape[1] * group
    p = place_node(convtranspose_model(per_group * group, group), "convt")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "awkward_output_channels", detail=f"has {per_group * group} output channels")


def test_awkward_output_channels_input_side_does_not_count():
    # 257 *input* channels: the real denoiser's conv_down (257 -> 64) ran on the NPU
    m = qdq_op("Conv", [[1, 257, 1, 1]], weights={"w": [64, 257, 1, 1]}, name="conv")
    assert_hw(place_node(m, "conv"))


def test_awkward_output_channels_sentence_follows_the_live_limit():
    prof = profile_with_limits(channel_chunk_max=128)
    p = place_node(conv_model(139), "conv", prof=prof)
    r = assert_sw(p, "awkward_output_channels", detail="chunks <= 128", prof=prof)
    assert "at most 128" in r.requirement and "at most 144" not in r.requirement
    assert_hw(place_node(conv_model(128), "conv", prof=prof))


def test_awkward_output_channels_mentions_scale_offset_zero_point():
    b = QDQ()
    x = b.input("x", [1, 8, 1, 1])
    y = b.op("Conv", [x, b.weight("w", [257, 8, 1, 1])], name="conv")
    b.output(y)
    m = b.model()
    # re-quantize the Conv output with a non-zero zero-point ('scale-offset format', OBS)
    for init in m.graph.initializer:
        if init.name == "act_zp":
            init.int32_data[:] = []
            init.raw_data = np.array(-5, np.int8).tobytes()
    p = place_node(m, "conv")
    assert_sw(p, "awkward_output_channels", detail="zero-point -5 ('scale-offset format')")


def test_channel_split_ok_arithmetic():
    assert channel_split_ok(144, 144) and channel_split_ok(1, 144)
    assert not channel_split_ok(149, 144) and not channel_split_ok(257, 144)
    assert channel_split_ok(258, 144) and channel_split_ok(145, 144)
    assert not channel_split_ok(131, 128) and channel_split_ok(130, 128)


# ---------------------------------------------------------------------------------------------
# Generic constraints: rank, dimensions, static shapes, quantization
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,hw", [([1, 1, 2, 2], True), ([2, 2], True), ([1, 1, 1, 2, 2], False)])
def test_rank_limit(shape, hw):
    p = place_node(qdq_op("Relu", [shape], name="relu"), "relu")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "rank_limit", detail=f"has rank 5 (shape {shape})", contains=("rank <= 4",))


@pytest.mark.parametrize("width,hw", [(65535, True), (65536, False)])
def test_dim_limit(width, hw):
    p = place_node(qdq_op("Relu", [[1, 1, 1, width]], name="relu"), "relu")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "dim_limit", detail="has a dimension of 65536", contains=("below 65536",))


def test_dim_limit_sentence_follows_the_live_limit():
    prof = profile_with_limits(max_dim=1000)
    assert_hw(place_node(qdq_op("Relu", [[1, 1, 1, 1000]], name="relu"), "relu", prof=prof))
    p = place_node(qdq_op("Relu", [[1, 1, 1, 1001]], name="relu"), "relu", prof=prof)
    assert_sw(p, "dim_limit", contains=("below 1001",), prof=prof)


def test_static_shape():
    a = analyze(qdq_op("Relu", [[1, "n", 4, 4]], name="relu"))
    assert_finding(a.placement.by_name["relu"], "static_shape", "compile_error", detail="unknown or dynamic shape",
                   contains=("--input-shape",))
    # the model-level finding names each dynamic input dimension (see test_cli_audit)


def test_quantized_activations_float_op_is_sw():
    p = place_node(float_model("Relu", [[1, 2, 4, 4]], name="relu"), "relu")
    r = assert_sw(p, "quantized_activations", detail="has float input(s) x0 and float output(s) y not covered by Q/DQ")
    assert r.tag == "DOC"
    assert p.kernel == "float"


def test_quantized_activations_qdq_op_is_hw():
    assert_hw(place_node(qdq_op("Relu", [[1, 2, 4, 4]], name="relu"), "relu"))


def test_all_failing_constraints_are_collected():
    # a float Conv with 257 outputs fails two requirements; both are reported
    m = float_model("Conv", [[1, 8, 1, 1]], name="conv", initializers={"w": np.ones((257, 8, 1, 1), np.float32)},
                    extra_inputs=["w"])
    p = place_node(m, "conv")
    assert [r.constraint for r in p.reasons] == ["quantized_activations", "awkward_output_channels"]


def test_int8_activations_uint8_qdq_is_a_compile_error():
    b = QDQ(UINT8, float_io=True)
    y = b.op("Relu", [b.input("x", [1, 2, 4, 4])], name="relu")
    b.output(y)
    a = analyze(b.model())
    p = a.placement.by_name["relu"]
    r = assert_finding(p, "int8_activations", "compile_error", detail="uint8-quantized tensor(s)")
    assert "quantized unsigned integer format is not supported" in r.requirement
    findings = [f for f in a.findings if f.constraint == "int8_activations"]
    assert len(findings) == 1
    assert findings[0].severity == "compile_error"
    assert "uint8" in findings[0].requirement and "'relu'" in findings[0].detail


def test_int8_activations_int8_qdq_has_no_finding():
    b = QDQ(float_io=True)
    y = b.op("Relu", [b.input("x", [1, 2, 4, 4])], name="relu")
    b.output(y)
    a = analyze(b.model())
    assert_hw(a.placement.by_name["relu"])
    assert not [f for f in a.findings if f.constraint == "int8_activations"]


def test_int8_activations_uint8_graph_io_is_accepted():
    # uint8 graph input/output (as in the real MediaPipe OE model, which compiled) is not flagged
    a = analyze(qdq_op("Relu", [[1, 2, 4, 4]], name="relu", act_type=UINT8))
    assert_hw(a.placement.by_name["relu"])
    assert not [f for f in a.findings if f.constraint == "int8_activations"]


# ---------------------------------------------------------------------------------------------
# Op-specific constraints
# ---------------------------------------------------------------------------------------------


def resize_model(mode="nearest", ctm="asymmetric", nearest_mode="floor", scales=(1, 1, 2, 2)):
    b = QDQ()
    x = b.input("x", [1, 1, 4, 4])
    s = b.const("scales", np.array(scales, np.float32))
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest_mode is not None:
        attrs["nearest_mode"] = nearest_mode
    y = b.op("Resize", [x, "", s], name="resize", **attrs)
    b.output(y)
    return b.model()


@pytest.mark.parametrize("kwargs,problem", [
    ({}, None),
    ({"scales": (1, 1, 3, 2)}, None),
    ({"mode": "linear", "ctm": "half_pixel", "nearest_mode": None}, "mode 'linear'"),
    ({"mode": "linear"}, "mode 'linear'"),
    ({"ctm": "half_pixel"}, "coordinate_transformation_mode 'half_pixel'"),
    ({"nearest_mode": "round_prefer_floor"}, "nearest_mode 'round_prefer_floor'"),
    ({"scales": (1, 1, 1.5, 1.5)}, "non-integer scales [1.0, 1.0, 1.5, 1.5]"),
], ids=["nearest-asym-floor-x2", "x3x2", "bilinear", "linear-asym", "half_pixel", "round", "x1.5"])
def test_resize(kwargs, problem):
    p = place_node(resize_model(**kwargs), "resize")
    if problem is None:
        assert_hw(p)
    else:
        assert_sw(p, "resize_nearest_asymmetric", detail=problem, contains=("'nearest'", "'asymmetric'", "'floor'"))


def reduce_model(op, shape, axes):
    return qdq_op(op, [shape], name="reduce", axes=axes)


@pytest.mark.parametrize("op,shape,axes,detail", [
    ("ReduceMean", [1, 4, 5, 6], [2, 3], None),
    ("ReduceMax", [1, 4, 5, 6], [2, 3], None),
    ("ReduceMean", [1, 4, 5, 6], [-1, -2], None),
    ("ReduceMean", [1, 4, 22, 23], [2, 3], None),
    ("ReduceMean", [1, 4, 5, 6], [1], "reduces axes [1] of a rank-4 tensor"),
    ("ReduceMean", [1, 4, 5, 6], [3], "reduces axes [3] of a rank-4 tensor"),
    ("ReduceMax", [1, 4, 6], [1, 2], "reduces axes [1, 2] of a rank-3 tensor"),
    ("ReduceMean", [1, 4, 23, 23], [2, 3], None),  # 529: above the old INF limit, below the 64x64 seen on HW
    ("ReduceMean", [1, 4, 65, 64], [2, 3], "reduces 4160 elements per channel (more than 4096)"),
])
def test_reduce_as_global_pool(op, shape, axes, detail):
    p = place_node(reduce_model(op, shape, axes), "reduce")
    if detail is None:
        assert_hw(p)
    else:
        assert_sw(p, "reduce_as_global_pool", detail=detail, contains=("trailing",))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
# the limit is the largest global pool seen on the NPU: 64 x 64 in the magnus baselines (2.2, 4.0)
@pytest.mark.parametrize("hw_,hw", [((22, 23), True), ((50, 11), True), ((64, 64), True), ((65, 64), False)])
def test_global_pool_size(op, hw_, hw):
    p = place_node(qdq_op(op, [[1, 2, *hw_]], name="gap"), "gap")
    if hw:
        assert_hw(p)
    else:
        n = hw_[0] * hw_[1]
        assert_sw(p, "global_pool_size", detail=f"pools {hw_[0]} x {hw_[1]} = {n} elements",
                  contains=("at most 4096 elements",))


def test_weights_constant():
    assert_hw(place_node(qdq_op("MatMul", [[1, 8]], weights={"w": [8, 4]}, weight_axis=1, name="mm"), "mm"))
    p = place_node(qdq_op("MatMul", [[1, 8], [8, 4]], name="mm"), "mm")
    assert_sw(p, "weights_constant", detail="multiplies two activations ('x0_dq' x 'x1_dq')",
              contains=("activation x activation",))


def gemm_bias_model(bias_is_activation: bool):
    b = QDQ()
    x = b.input("x", [1, 8])
    c = b.input("c", [1, 4]) if bias_is_activation else b.bias("c", 4)
    y = b.op("Gemm", [x, b.weight("w", [4, 8]), c], name="gemm", transB=1)
    b.output(y)
    return b.model()


def test_gemm_bias_constant_is_a_compile_error_finding():
    a = analyze(gemm_bias_model(True))
    assert_finding(a.placement.by_name["gemm"], "gemm_bias_constant", "compile_error",
                   detail="has a computed bias 'c_dq'", contains=("TOOL ERROR: list index out of range",))
    findings = [f for f in a.findings if f.constraint == "gemm_bias_constant"]
    assert len(findings) == 1 and findings[0].severity == "compile_error"
    assert findings[0].detail == "'gemm' has a computed bias 'c_dq'"


def test_gemm_constant_bias_is_fine():
    a = analyze(gemm_bias_model(False))
    assert_hw(a.placement.by_name["gemm"])
    assert not [f for f in a.findings if f.constraint == "gemm_bias_constant"]


def binary_model(op, *, const_first: bool = False, const_second: bool = True):
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    other = b.qconst("k", np.full((1, 2, 4, 4), 3, np.int8)) if (const_first or const_second) else b.input("z", [1, 2, 4, 4])
    ins = [other, x] if const_first else [x, other]
    y = b.op(op, ins, name="bin")
    b.output(y)
    return b.model()


def test_div_by_constant():
    assert_hw(place_node(binary_model("Div"), "bin"))
    p = place_node(binary_model("Div", const_second=False), "bin")
    assert_sw(p, "div_by_constant", detail="divides by the runtime tensor 'z_dq'")


def test_sub_constant_first():
    assert_hw(place_node(binary_model("Sub"), "bin"))
    assert_hw(place_node(binary_model("Sub", const_second=False), "bin"))  # activation - activation
    p = place_node(binary_model("Sub", const_first=True), "bin")
    assert_sw(p, "sub_constant_first", detail="computes constant 'k' minus an activation", contains=("Sub(constant, x)",))


@pytest.mark.parametrize("shape,perm,hw", [
    ([1, 2, 3, 4], [0, 2, 3, 1], True),   # NCHW -> NHWC
    ([1, 2, 3, 4], [0, 3, 1, 2], True),   # NHWC -> NCHW
    ([2, 3, 4], [0, 2, 1], True),         # rank 3
    ([1, 1, 1, 4], [0, 2, 1, 3], True),   # only size-1 axes move: a reshape
    ([1, 2, 3, 4], [0, 2, 1, 3], False),
])
def test_transpose_perm(shape, perm, hw):
    p = place_node(qdq_op("Transpose", [shape], name="tr", perm=perm), "tr")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "transpose_perm", detail=f"has perm {perm} on shape {shape}", contains=("[0, 2, 1, 3]",))


@pytest.mark.parametrize("mode,hw", [("constant", True), ("reflect", False), ("edge", False)])
def test_pad_constant_mode(mode, hw):
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    y = b.op("Pad", [x, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], name="pad", mode=mode)
    b.output(y)
    p = place_node(b.model(), "pad")
    if hw:
        assert_hw(p)
    else:
        assert_sw(p, "pad_constant_mode", detail=f"pads in '{mode}' mode")


def bn_params(b: QDQ, c: int) -> list[str]:
    return [b.const("bn_scale", np.ones(c, np.float32)), b.const("bn_b", np.zeros(c, np.float32)),
            b.const("bn_mean", np.zeros(c, np.float32)), b.const("bn_var", np.ones(c, np.float32))]


def test_batchnorm_folded_after_conv():
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    y = b.op("BatchNormalization", [c, *bn_params(b, 4)], name="bn")
    b.output(y)
    assert_hw(place_node(b.model(), "bn"))


def test_batchnorm_standalone_is_sw():
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    y = b.op("BatchNormalization", [x, *bn_params(b, 4)], name="bn")
    b.output(y)
    p = place_node(b.model(), "bn")
    assert_sw(p, "batchnorm_folded", detail="'bn' follows a graph input, not a Conv/Gemm it could fold into")


def test_batchnorm_after_relu_is_sw():
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    r = b.op("Relu", [x], name="relu")
    y = b.op("BatchNormalization", [r, *bn_params(b, 4)], name="bn")
    b.output(y)
    assert_sw(place_node(b.model(), "bn"), "batchnorm_folded", detail="follows 'Relu' node 'relu'")


def prelu_model(slope: str):
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    if slope == "quantized":
        s = b.qconst("slope", np.full((4, 1, 1), 3, np.int8))
    elif slope == "float":
        s = b.const("slope", np.full((4, 1, 1), 0.25, np.float32))
    else:
        s = b.input("slope", [4, 1, 1])
        s = b.op("Relu", [s], name="slope_relu")
    y = b.op("PRelu", [x, s], name="prelu")
    b.output(y)
    return b.model()


def test_prelu_slope_quantized():
    assert_hw(place_node(prelu_model("quantized"), "prelu"))
    p = place_node(prelu_model("float"), "prelu")
    assert_sw(p, "prelu_slope_quantized", detail="slope 'slope' is an unquantized float constant")
    assert_sw(p, "params_quantized", detail="parameter 'slope' is a float constant with no DequantizeLinear",
              contains=("WARNING: <tensor> is not quantized",))
    # between Q -> DQ pairs the SW PRelu runs the int8 kernel, whose float slope is its own business
    # (per-channel MobileFaceNet 2.1: 33 SW PRelu, no Q/DQ epoch)
    assert p.kernel == "int8"


def test_softmax_sw_by_default_and_hw_with_expand_softmax():
    m = qdq_op("Softmax", [[1, 10]], name="softmax", axis=-1)
    p = place_node(m, "softmax")
    assert p.unit == "SW"
    (r,) = p.reasons
    assert r.constraint == "sw_op:Softmax"
    assert "--expand-softmax" in r.requirement and r.detail == "'softmax' is a Softmax"
    assert r.tag == "OBS"
    assert p.kernel == "int8"  # Q/DQ around it fold into the one SW epoch
    p2 = place_node(m, "softmax", options={"--expand-softmax"})
    assert_hw(p2)
    assert "--expand-softmax" in p2.role


def test_op_not_in_the_table_is_sw():
    p = place_node(qdq_op("Erf", [[1, 2, 4, 4]], name="erf"), "erf")
    assert p.unit == "SW"
    (r,) = p.reasons
    assert r.constraint == "operator_table"
    assert "not in the NPU operator table" in r.detail and "'erf'" in r.detail and "Erf" in r.detail
    assert r.requirement == "The op must be in the NPU operator table; other ops run in SW on the Cortex-M55."
    assert p.kernel == "float"


# ---------------------------------------------------------------------------------------------
# Hazards (compile with no SW epoch but hang the board) and performance notes
# ---------------------------------------------------------------------------------------------


def depthwise_model(stride: int):
    b = QDQ()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Conv", [x, b.weight("w", [4, 1, 3, 3])], name="dw", group=4, strides=[stride, stride],
             pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    b.output(y)
    return b.model()


def test_depthwise_stride2_hang():
    a = analyze(depthwise_model(2))
    p = a.placement.by_name["dw"]
    assert p.unit == "HW" and p.reasons == ()  # it compiles with no SW epoch ...
    r = reason(p, "depthwise_stride2_hang")  # ... and hung the board in one third-party report
    assert r.severity == "note" and r.detail == "'dw' is a depthwise Conv (4 groups) with strides [2, 2]"
    assert "NAF008" in r.requirement and "ST's own N6 models" in r.requirement
    assert not [f for f in a.findings if f.constraint == "depthwise_stride2_hang"], "a note, not a model finding"


def test_depthwise_stride1_no_hang():
    a = analyze(depthwise_model(1))
    assert_hw(a.placement.by_name["dw"])
    assert a.placement.by_name["dw"].notes == ()
    assert not [f for f in a.findings if f.severity == "hang"]


def conv_relu_model(reshape: bool):
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    t = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    if reshape:
        t = b.op("Reshape", [t, b.const("shape", np.array([1, 64], np.int64))], name="reshape")
    y = b.op("Relu", [t], name="relu")
    b.output(y)
    return b.model()


def test_reshape_between_conv_and_relu_hang():
    a = analyze(conv_relu_model(True))
    p = a.placement.by_name["relu"]
    assert p.unit == "HW"
    r = reason(p, "reshape_between_conv_relu_hang")
    assert r.severity == "hang"
    assert r.detail == "'relu' follows 'Reshape' node 'reshape' after Conv 'conv'"
    assert [f.constraint for f in a.findings if f.severity == "hang"] == ["reshape_between_conv_relu_hang"]


def test_relu_directly_after_conv_no_hang():
    a = analyze(conv_relu_model(False))
    assert not [f for f in a.findings if f.severity == "hang"]


@pytest.mark.parametrize("kh,kw,stride,note", [
    (3, 3, 1, False), (3, 6, 1, False), (3, 7, 1, True), (4, 3, 1, True), (5, 5, 1, True),
    (3, 12, 2, False), (3, 13, 2, True),
])
def test_conv_kernel_native(kh, kw, stride, note):
    m = qdq_op("Conv", [[1, 1, 16, 16]], weights={"w": [1, 1, kh, kw]}, name="conv", strides=[stride, stride])
    p = place_node(m, "conv")
    assert_hw(p)  # a note never moves the op off the NPU
    notes = [r for r in p.notes if r.constraint == "conv_kernel_native"]
    if note:
        (r,) = notes
        assert r.severity == "note"
        assert r.detail == f"'conv' has a {kh}x{kw} kernel at stride {stride}"
        assert "up to 3 rows and 6 columns at stride 1 (12 at stride >= 2)" in r.requirement
    else:
        assert notes == []


# ---------------------------------------------------------------------------------------------
# The registry: every constraint has a requirement sentence that formats with the live profile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cid", sorted(REGISTRY))
def test_every_constraint_has_a_requirement_sentence(cid):
    c = REGISTRY[cid]
    assert c.func.__doc__ and c.func.__doc__.strip()
    assert c.template.strip() and c.template.endswith(".")
    values = profile().values()
    text = c.requirement(values)  # no KeyError
    assert text and "{" not in text and "}" not in text
    fields = {f for _, f, _, _ in string.Formatter().parse(c.template) if f}
    assert fields <= set(values), f"{cid} uses {fields - set(values)} not in the profile"
    for f in fields:  # each placeholder shows the profile's number
        assert str(values[f]) in text
    assert c.tag in TAGS
    assert c.severity in SEVERITIES


def test_profile_operator_table_names_only_registered_constraints():
    prof = profile()
    named = {cid for rule in prof.operators.values() for cid in rule.constraints}
    assert named, "the operator table names no constraint at all"
    assert named <= set(REGISTRY), f"unknown constraints in the profile: {named - set(REGISTRY)}"
    assert set(GENERIC) <= set(REGISTRY) and set(HAZARDS) <= set(REGISTRY)


def test_profile_limits_have_provenance_tags():
    for name, lim in profile().limits.items():
        assert lim.tag in TAGS, name
        assert lim.source.strip(), name
    for op, rule in profile().operators.items():
        assert rule.tag in TAGS, op
        if rule.tier == "sw":
            assert rule.why.strip(), f"{op}: a SW op needs a 'why' sentence"


def test_requirement_numbers_come_from_the_profile():
    # channel_chunk_max is data: changing it changes the sentence (no number typed twice)
    a = requirement("awkward_output_channels", profile_with_limits(channel_chunk_max=100))
    b = requirement("awkward_output_channels")
    assert re.search(r"at most 100\b", a) and re.search(r"at most 144\b", b)
