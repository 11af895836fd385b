"""The compiler's own lowerings, per stedgeai core version: inserted SW/hybrid epochs, the names the
report prints, --core and the stedgeai options with values (NEURAL_ART.md s7)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fixer.errors import ProfileError
from fixer.npu.profile import load_profile, normalize_options, option_args
from tests.helpers import QDQ, analyze, qdq_op


def core(version: str, options=()):
    return load_profile(options=frozenset(options), core=version)


def dilated(dilation: int, *, depthwise: bool = True):
    c = 8
    return qdq_op("Conv", [[1, c, 16, 16]], name="conv", weights={"w": [c, 1 if depthwise else c, 3, 3]},
                  group=c if depthwise else 1, dilations=[dilation, dilation], pads=[dilation] * 4)


# ------------------------------------------------------------------------------ versions and options


def test_core_selection():
    assert load_profile().core_version == "4.0"  # the newest core in the profile data
    assert core("2.2.0-20266").core_version == "2.2"
    assert core("4.0.1").core_version == "4.0"
    assert core("4").core_version == "4.0"
    assert core("3.1").core_version == "3.0"  # an unlisted newer patch: the newest listed one not above it
    with pytest.raises(ProfileError, match="knows stedgeai core 2.0, 2.1, 2.2, 3.0, 4.0"):
        core("1.9")
    with pytest.raises(ProfileError, match="is not a version"):
        core("latest")


def test_core_limits_are_per_version_and_do_not_leak():
    assert core("4.0").limit("input_copy_epochs") == 0
    assert core("2.2").limit("input_copy_epochs") == 1  # not the default core's value
    assert core("2.0").limit("mul_activations_extra_epochs") == 1 and core("2.2").limit("mul_activations_extra_epochs") == 0


def test_stedgeai_options_take_their_value_in_one_argument():
    opts = normalize_options(["--input-data-type float32", "--output-data-type=INT8", "--expand-softmax"])
    assert opts == {"--input-data-type float32", "--output-data-type int8", "--expand-softmax"}
    assert option_args(opts) == ["--expand-softmax", "--input-data-type", "float32", "--output-data-type", "int8"]
    assert load_profile(options=opts).option_value("--input-data-type") == "float32"
    with pytest.raises(ProfileError, match="needs its value in the same argument"):
        normalize_options(["--input-data-type"])
    with pytest.raises(ProfileError, match="use one of float32, int8, uint8"):
        normalize_options(["--input-data-type float16"])
    with pytest.raises(ProfileError, match="unknown stedgeai option"):
        load_profile(options=frozenset({"--no-such-thing"}))


# ------------------------------------------------------------------------------ lowerings


def test_dilated_conv_gets_space_to_depth_and_depth_to_space_and_the_undilated_none():
    a = analyze(dilated(2), prof=core("2.2"))
    assert a.estimate.sw_ops == Counter({"SpaceToDepth": 1, "DepthToSpace": 1})
    assert a.placement.by_name["conv"].unit == "HW"
    kinds = [(g.unit, g.reported_as or g.ops[0]) for g in a.estimate.groups if not g.nodes[0].startswith("input")]
    assert kinds == [("SW", "SpaceToDepth"), ("HW", "Conv"), ("SW", "DepthToSpace")]
    entries = [e for e in a.sw_nodes() if e["from_nodes"] == ["conv"]]
    assert [(e["op_type"], e["unit"], e["constraints"]) for e in entries] == [
        ("SpaceToDepth", "SW", ["lowering:dilated_conv"]), ("DepthToSpace", "SW", ["lowering:dilated_conv"])]
    # the same convolution without dilation (what NAF015 writes): no inserted epoch
    assert analyze(dilated(1), prof=core("2.2")).estimate.sw_ops == Counter()
    # core 4.0: both inserted ops are hybrid epochs
    b = analyze(dilated(2), prof=core("4.0"))
    assert b.estimate.sw_epochs == 0 and b.estimate.hybrid_ops == Counter({"SpaceToDepth": 1, "DepthToSpace": 1})


def test_conv_transpose_and_nearest_upsampling_lower_to_depth_to_space():
    ct = qdq_op("ConvTranspose", [[1, 4, 8, 8]], name="up", weights={"w": [4, 4, 2, 2]}, strides=[2, 2])
    # zero insertion: a Concat with zeros and a DepthToSpace, both SW in 2.2 (PP-OCRv4 det c_info), then two HW
    # epochs (an Identity copy, the crop/pad Conv) and the Conv itself
    a22 = analyze(ct, prof=core("2.2"))
    assert a22.estimate.sw_ops == Counter({"Concat": 1, "DepthToSpace": 1})
    assert [g.unit for g in a22.estimate.groups if g.nodes == ["up"]] == ["HW", "HW", "HW", "SW", "SW"]
    assert analyze(ct, prof=core("3.0")).estimate.hybrid_ops == Counter({"DepthToSpace": 1})
    assert analyze(ct, prof=core("4.0")).estimate.hybrid_ops == Counter({"Concat": 1, "DepthToSpace": 1})
    b = QDQ()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Resize", [x, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], name="rs", mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    b.output(y)
    a = analyze(b.model(), prof=core("2.0"))
    assert a.placement.by_name["rs"].unit == "HW"
    assert [(g.unit, g.reported_as) for g in a.estimate.groups if g.nodes == ["rs"]] == [("SW", "DepthToSpace")]


def test_stride_beyond_the_native_stride_gets_space_to_depth():
    m = qdq_op("Conv", [[1, 8, 9, 9]], name="conv", weights={"w": [8, 8, 3, 3]}, strides=[3, 3])
    assert analyze(m, prof=core("2.2")).estimate.sw_ops == Counter({"SpaceToDepth": 1})
    m2 = qdq_op("Conv", [[1, 8, 9, 9]], name="conv", weights={"w": [8, 8, 3, 3]}, strides=[2, 2])
    assert analyze(m2, prof=core("2.2")).estimate.sw_ops == Counter()


def test_channel_pad_is_two_transposes():
    b = QDQ()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Pad", [x, b.const("pads", np.array([0, 0, 0, 0, 0, 4, 0, 0], np.int64))], name="pad")
    b.output(y)
    a = analyze(b.model(), prof=core("2.2"))
    assert [(g.unit, g.reported_as or g.ops[0]) for g in a.estimate.groups if g.nodes == ["pad"]] == [
        ("SW", "Transpose"), ("HW", "Pad"), ("HW", "Pad"), ("SW", "Transpose")]


def _pool_then_channel_pad(channels: int):
    b = QDQ()
    x = b.input("x", [1, channels, 16, 16])
    p = b.op("MaxPool", [x], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Pad", [p, b.const("pads", np.array([0, 0, 0, 0, 0, channels, 0, 0], np.int64))], name="pad")
    b.output(y)
    return b.model()


@pytest.mark.parametrize("channels, version, sw_transposes", [
    (32, "2.2", 1), (64, "2.1", 1),  # face_landmark c_info: 'MaxPool_62 | Transpose_63' NODE_HW
    (16, "2.2", 2), (28, "2.2", 2),  # face_landmark Transpose_29, blazeface: SW
    (32, "2.0", 2),  # not seen in 2.0: the lowering as before
])
def test_channel_pad_after_pool_transposes_on_hw(channels, version, sw_transposes):
    a = analyze(_pool_then_channel_pad(channels), prof=core(version))
    assert a.estimate.sw_ops == Counter({"Transpose": sw_transposes})
    pool = [g for g in a.estimate.groups if "pool" in g.nodes]
    assert len(pool) == 1 and pool[0].unit == "HW"
    assert ("pad" in pool[0].nodes) == (sw_transposes == 1)


def _wide_conv_then_mean(k: int):
    b = QDQ()
    x = b.input("x", [1, 3, 16, 16])
    y = b.op("Conv", [x, b.weight("w", [8, 3, k, k])], name="conv", pads=[k // 2] * 4)
    r = b.op("Relu", [y], name="relu")
    g = b.op("GlobalAveragePool", [r], name="gap")
    b.output(g)
    return b.model()


def test_wide_kernel_conv_is_decomposed_in_bands():
    # magnus baselines: 7x7 conv + MEAN is 5 epochs in 2.2.0 and 4.0.0; 5x5 is 2 (2.2) and 1 (4.0)
    # (an ONNX graph input also gets core 2.2's input copy epoch: not counted here)
    for version in ("2.2", "4.0"):
        e = analyze(_wide_conv_then_mean(7), prof=core(version)).estimate
        own = [g for g in e.groups if not g.nodes[0].startswith("input copy")]
        assert len(own) == 5 and e.sw_epochs == 0
        conv = [g for g in own if g.nodes[0] == "conv"]
        assert len(conv) == 4 and "relu" in conv[-1].nodes  # 3 bands of <= 3 rows, then the sum with the Relu
        assert own[-1].nodes == ["gap"]  # core 4.0 does not fuse the MEAN into the summing epoch
    for version, n in (("2.2", 2), ("4.0", 1)):
        e = analyze(_wide_conv_then_mean(5), prof=core(version)).estimate
        assert len([g for g in e.groups if not g.nodes[0].startswith("input copy")]) == n


# ------------------------------------------------------------------------------ names and edges


def _float_softmax_tail():
    b = QDQ()
    x = b.input("x", [1, 4, 8, 8])
    y = b.op("Conv", [x, b.weight("w", [4, 4, 1, 1])], name="conv")
    r = b.op("Reshape", [y, b.const("shape", np.array([1, 256], np.int64))], name="flat")
    s = b.raw_op("Softmax", [r], name="sm", axis=-1)
    b.float_output(s)
    return b.model()


def test_float_kernels_are_named_per_core():
    m = _float_softmax_tail()
    assert analyze(m, prof=core("2.2")).estimate.sw_ops["Softmax"] == 1
    assert analyze(m, prof=core("4.0")).estimate.sw_ops["Softmax(float)"] == 1


def test_estimate_json_fields():
    e = analyze(dilated(2), prof=core("4.0")).estimate.as_dict()
    assert set(e) == {"epochs", "sw_epochs", "hybrid_epochs", "hw_epochs", "hw_ratio", "sw_ops", "hybrid_ops", "core",
                      "latency_ms", "latency"}  # the estimated time (tests/test_latency.py)
    assert e["core"] == "4.0" and e["hybrid_ops"] == {"DepthToSpace": 1, "SpaceToDepth": 1}
    assert e["epochs"] == e["sw_epochs"] + e["hybrid_epochs"] + e["hw_epochs"]
    assert e["hw_ratio"] == 1.0  # hybrid epochs count as offloaded, as the reports count them
