"""Epoch estimate rules and the memory estimate, on small built models with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from fixer.npu.estimate import EpochEstimate
from fixer.npu.profile import load_profile
from fixer.npu.mpool import default_stm32n6_pools
from tests.helpers import QDQ, analyze, float_model, make_model, qdq_op


def epochs(a, *, copies: bool = False) -> list[tuple[str, list[str]]]:
    """Epoch groups; the graph-input copy epochs are left out unless ``copies`` (tested on their own)."""
    return [(g.unit, list(g.nodes)) for g in a.estimate.groups
            if copies or not g.nodes[0].startswith("input copy of")]


# ---------------------------------------------------------------------------------------------
# Epochs
# ---------------------------------------------------------------------------------------------


def test_conv_relu_is_one_hw_epoch():
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    c = b.raw_op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    y = b.raw_op("Relu", [c], name="relu")
    b.output(y)
    a = analyze(b.model(), prof=load_profile(core="2.2"))
    assert epochs(a) == [("HW", ["conv", "relu"])]
    # + the input copy epoch (core 2.x)
    assert (a.estimate.epochs, a.estimate.sw_epochs, a.estimate.hw_epochs) == (2, 0, 2)


def test_conv_relu_through_qdq_is_one_hw_epoch():
    # onnxruntime's QDQ layout puts Q -> DQ between Conv and Relu: still one epoch
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    y = b.op("Relu", [c], name="relu")
    b.output(y)
    assert epochs(analyze(b.model())) == [("HW", ["conv", "relu"])]


def test_relu_on_a_shared_tensor_starts_its_own_epoch():
    # the Conv output has two users: the Relu cannot fuse into the Conv's epoch
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    r = b.op("Relu", [c], name="relu")
    s = b.op("Sigmoid", [c], name="sig")
    b.output(r, "y1")
    b.output(s, "y2")
    a = analyze(b.model())
    assert epochs(a) == [("HW", ["conv"]), ("HW", ["relu"]), ("HW", ["sig"])]


def test_conv_plus_residual_add_fuses():
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    c1 = b.op("Conv", [x, b.weight("w1", [4, 4, 1, 1])], name="conv1")
    c2 = b.op("Conv", [c1, b.weight("w2", [4, 4, 1, 1], seed=1)], name="conv2")
    y = b.op("Add", [c2, c1], name="add")  # c1 is shared (conv2 and add): add joins conv2's epoch
    b.output(y)
    a = analyze(b.model())
    assert epochs(a) == [("HW", ["conv1"]), ("HW", ["conv2", "add"])]


def test_sw_softmax_between_qdq_is_one_sw_epoch():
    b = QDQ()
    x = b.input("x", [1, 10])
    y = b.op("Softmax", [x], name="softmax", axis=-1)
    b.output(y)
    a = analyze(b.model())
    assert epochs(a) == [("SW", ["softmax"])]  # no conversion epochs around the int8 kernel
    assert a.placement.by_name["x_DequantizeLinear"].unit == "folded"
    assert a.placement.by_name["softmax_out_QuantizeLinear"].unit == "folded"


def test_float_sw_op_costs_dq_op_q_three_sw_epochs():
    # (an op with no int8 SW kernel: a float-slope PRelu between Q -> DQ pairs now runs the int8 SW
    # kernel, per-channel MobileFaceNet 2.1; see test_placement_round3)
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    y = b.op("Erf", [x], name="prelu")
    b.output(y)
    a = analyze(b.model())
    assert epochs(a) == [("SW", ["x_DequantizeLinear"]), ("SW", ["prelu"]), ("SW", ["prelu_out_QuantizeLinear"])]
    assert a.estimate.sw_epochs == 3
    pl = a.placement.by_name
    assert [r.constraint for r in pl["x_DequantizeLinear"].reasons] == ["float_island"]
    assert "'prelu'" in pl["x_DequantizeLinear"].reasons[0].detail
    assert [r.constraint for r in pl["prelu_out_QuantizeLinear"].reasons] == ["float_island"]
    assert "float SW op 'prelu'" in pl["prelu_out_QuantizeLinear"].reasons[0].detail


def test_float_input_prologue_transpose_and_quantize_are_one_sw_epoch():
    b = QDQ()
    x = b.float_input("image", [1, 4, 4, 2])  # NHWC float input, as TF exports write it
    t = b.raw_op("Transpose", [x], name="to_nchw", perm=[0, 3, 1, 2])
    c = b.op("Conv", [t, b.weight("w", [4, 2, 1, 1])], name="conv")  # Q -> DQ inserted on t
    b.output(c)
    a = analyze(b.model())
    assert epochs(a) == [("SW", ["to_nchw", "to_nchw_out_QuantizeLinear"]), ("HW", ["conv"])]
    q = a.placement.by_name["to_nchw_out_QuantizeLinear"]
    assert q.role == "graph-input conversion"
    assert q.reasons[0].constraint == "graph_edge_quantize"
    assert "'image'" in q.reasons[0].detail


FLOAT_IO = ("--input-data-type float32", "--output-data-type float32")


def test_float_input_quantize_alone_is_one_sw_epoch():
    b = QDQ(float_io=True)
    x = b.input("x", [1, 2, 4, 4])
    y = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    b.output(y)
    a = analyze(b.model(), options=FLOAT_IO)
    assert epochs(a) == [("SW", ["x_QuantizeLinear"]), ("HW", ["conv"]), ("SW", ["y_DequantizeLinear"])]
    # stedgeai's default for an ONNX QDQ model: int8 I/O, both conversions dropped (NEURAL_ART.md s7)
    d = analyze(b.model())
    assert epochs(d) == [("HW", ["conv"])]
    assert d.placement.by_name["x_QuantizeLinear"].role.startswith("graph-input conversion (dropped")
    assert d.placement.by_name["y_DequantizeLinear"].role.startswith("graph-output conversion (dropped")
    # one option each
    i = analyze(b.model(), options=("--input-data-type float32",))
    assert epochs(i) == [("SW", ["x_QuantizeLinear"]), ("HW", ["conv"])]


def test_trailing_dequantize_is_one_sw_epoch_and_hw_ratio():
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    y = b.op("Conv", [x, b.weight("w", [4, 2, 1, 1])], name="conv")
    q = b._quantize(y)
    b.nodes.append(helper.make_node("DequantizeLinear", [q, "act_scale", "act_zp"], ["out"], name="out_dq"))
    b.float_output("out")
    a = analyze(b.model(), prof=load_profile(options=frozenset({"--output-data-type float32"}), core="2.2"))
    assert epochs(a) == [("HW", ["conv"]), ("SW", ["out_dq"])]
    dq = a.placement.by_name["out_dq"]
    assert dq.role == "graph-output conversion" and dq.reasons[0].constraint == "graph_edge_dequantize"
    e = a.estimate
    assert (e.epochs, e.sw_epochs, e.hw_epochs) == (3, 1, 2)  # input copy + conv + trailing DQ
    assert e.hw_ratio == pytest.approx(2 / 3)
    d = e.as_dict()
    assert d.pop("latency_ms") > 0 and d.pop("latency")["estimated"] is True  # estimated time (test_latency.py)
    assert d == {"epochs": 3, "sw_epochs": 1, "hybrid_epochs": 0, "hw_epochs": 2, "hw_ratio": 0.6667,
                 "sw_ops": {"DequantizeLinear": 1}, "hybrid_ops": {}, "core": "2.2"}


def test_hw_ratio_arithmetic():
    assert EpochEstimate(epochs=0, sw_epochs=0, groups=()).hw_ratio == 1.0
    e = EpochEstimate(epochs=3, sw_epochs=1, groups=())
    assert e.hw_epochs == 2 and e.hw_ratio == pytest.approx(2 / 3)
    assert e.as_dict()["hw_ratio"] == 0.6667
    assert EpochEstimate(epochs=56, sw_epochs=1, groups=()).hw_ratio == pytest.approx(55 / 56)


def test_movement_and_concat_add_no_epoch():
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [2, 2, 1, 1])], name="conv")
    r = b.op("Reshape", [c, b.const("shape", np.array([1, 2, 16], np.int64))], name="reshape")
    cat = b.op("Concat", [r, r], name="cat", axis=1)
    b.output(cat)
    a = analyze(b.model())
    assert epochs(a) == [("HW", ["conv"])]
    assert a.placement.by_name["reshape"].unit == "folded"
    assert a.placement.by_name["cat"].unit == "HW"


@pytest.mark.parametrize("absorbed", [True, False])
def test_pad_epochs(absorbed):
    # a Pad feeding a Conv is absorbed into its padding; any other Pad costs extra_epochs HW epochs
    b = QDQ()
    x = b.input("x", [1, 2, 4, 4])
    p = b.op("Pad", [x, b.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], name="pad")
    if absorbed:
        p = b.op("Conv", [p, b.weight("w", [2, 2, 3, 3])], name="conv")
    b.output(p)
    a = analyze(b.model())
    extra = a.profile.operators["Pad"].extra_epochs
    if absorbed:
        assert epochs(a) == [("HW", ["conv"])]
    else:
        assert extra == 2
        assert epochs(a) == [("HW", ["pad"])] * extra


def test_prelu_hw_costs_one_extra_epoch():
    b = QDQ()
    x = b.input("x", [1, 4, 4, 4])
    c = b.op("Conv", [x, b.weight("w", [4, 4, 1, 1])], name="conv")
    y = b.op("PRelu", [c, b.qconst("slope", np.full((4, 1, 1), 3, np.int8))], name="prelu")
    b.output(y)
    a = analyze(b.model())
    assert epochs(a) == [("HW", ["conv", "prelu"]), ("HW", ["prelu"])]


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


def chain_model(*, quantized: bool, bias: bool = False):
    """x[1,4,8,8] -> conv1(4->8) -> conv2(8->16) -> conv3(16->4) -> y, all 1x1."""
    if not quantized:
        from onnx import TensorProto, numpy_helper

        rng = np.random.default_rng(0)
        inits, nodes, t = [], [], "x"
        for i, (co, ci) in enumerate([(8, 4), (16, 8), (4, 16)], start=1):
            inits.append(numpy_helper.from_array(rng.random((co, ci, 1, 1)).astype(np.float32), f"w{i}"))
            out = "y" if i == 3 else f"c{i}"
            nodes.append(helper.make_node("Conv", [t, f"w{i}"], [out], name=f"conv{i}"))
            t = out
        return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    b = QDQ()
    t = b.input("x", [1, 4, 8, 8])
    for i, (co, ci) in enumerate([(8, 4), (16, 8), (4, 16)], start=1):
        ins = [t, b.weight(f"w{i}", [co, ci, 1, 1], seed=i)]
        if bias and i == 1:
            ins.append(b.bias("b1", co))
        t = b.op("Conv", ins, name=f"conv{i}")
    b.output(t)
    return b.model()


def test_peak_activation_by_liveness_int8():
    # live buffers (int8 domain, 1 byte/element): x 256 B, c1 512 B, c2 1024 B, c3 256 B.
    # at conv1: x + c1 = 768; at conv2: c1 + c2 = 1536 (peak); at conv3: c2 + c3 = 1280.
    a = analyze(chain_model(quantized=True))
    m = a.memory
    assert m.peak_activation_bytes == 512 + 1024
    assert m.peak_at == "conv2"
    assert m.largest_tensor_bytes == 1024
    assert m.unknown_tensors == 0


def test_float_tensors_count_their_element_size():
    # the same chain in float: 4 bytes per element
    a = analyze(float_chain := chain_model(quantized=False))
    assert float_chain.graph.node[0].op_type == "Conv"
    assert a.memory.peak_activation_bytes == 4 * (512 + 1024)


def test_weights_bytes():
    # int8 weights 8*4 + 16*8 + 4*16 = 224 bytes; with an int32 bias of 8 channels: + 32
    assert analyze(chain_model(quantized=True)).memory.weights_bytes == 224
    assert analyze(chain_model(quantized=True, bias=True)).memory.weights_bytes == 224 + 32
    assert analyze(chain_model(quantized=False)).memory.weights_bytes == 4 * 224


def onchip_capacity() -> int:
    return sum(p.size_bytes for p in default_stm32n6_pools() if p.enabled and p.writable and p.on_chip)


def relu_model(h: int, w: int):
    b = QDQ()
    y = b.op("Relu", [b.input("x", [1, 1, h, w])], name="relu")
    b.output(y)
    return b.model()


def test_default_onchip_capacity_is_cpuram2_plus_four_npurams():
    assert onchip_capacity() == 1024 * 1024 + 4 * 448 * 1024


@pytest.mark.parametrize("rows,fits", [(1408, True), (1409, False)])
def test_fits_on_chip_around_the_default_capacity(rows, fits):
    # Relu: input and output live together -> peak = 2 * rows * 1024 bytes; 2 * 1408 KiB = 2816 KiB
    cap = onchip_capacity()
    a = analyze(relu_model(rows, 1024))
    m = a.memory
    assert m.peak_activation_bytes == 2 * rows * 1024
    assert m.onchip_bytes == cap
    assert m.fits_on_chip is fits
    assert (m.peak_activation_bytes <= cap) is fits
    on_chip = [f for f in a.findings if f.constraint == "activations_on_chip"]
    if fits:
        assert m.external_bytes == 0 and on_chip == []
    else:
        assert m.external_bytes == m.peak_activation_bytes - cap
        (f,) = on_chip
        assert f"{cap / 1024:.0f} KiB on-chip" in f.detail


def test_input_copy_epoch_unless_the_input_is_read_by_a_transpose():
    """c_info of the real pairs: an 'Identity_inserted' HW epoch copies the input (MobileNetV2,
    MobileFaceNet) except where a Transpose reads it first (MediaPipe, YAMNet, npu_conv2d); core 4.0
    inserts none (the same single-Conv models: 2 epochs in 2.2.0, 1 in 4.0.0)."""
    a = analyze(qdq_op("Relu", [[1, 4, 3, 3]], name="relu"), prof=load_profile(core="2.2"))
    assert epochs(a, copies=True)[0] == ("HW", ["input copy of 'x0'"])
    assert epochs(analyze(qdq_op("Relu", [[1, 4, 3, 3]], name="relu")), copies=True) == [("HW", ["relu"])]
    b = analyze(qdq_op("Transpose", [[1, 4, 3, 3]], name="t", perm=[0, 2, 3, 1]))
    assert not any(n[0].startswith("input copy") for _, n in epochs(b, copies=True))
    assert epochs(b) == [("HW", ["t"])]


def test_large_weights_take_one_more_epoch():
    """INF from the YAMNet report: a layer with >= 256 KiB of int8 weights takes two HW epochs."""
    assert analyze(qdq_op("Relu", [[1, 1, 1, 1]])).profile.limit("weights_extra_epoch_bytes") == 262144
    for cin, expect in ((255, 1), (256, 2)):
        a = analyze(qdq_op("Conv", [[1, cin, 1, 1]], name="conv", weights={"w": [1024, cin, 1, 1]}))
        conv = [n for u, n in epochs(a) if u == "HW" and "conv" in n]
        assert len(conv) == expect, (cin, epochs(a))
