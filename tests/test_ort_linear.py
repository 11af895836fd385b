"""The linear-time adapters around onnxruntime's quantizer give onnxruntime's own result.

Each test quantizes (or augments) the same small model twice, once with onnxruntime unpatched and
once inside ``linear_time_quantization``, and compares the outputs: the augmented calibration graph
node for node, and the quantized model's graph byte for byte (so every scale and zero-point).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fixer.quantize.ort_linear import linear_time_quantization

SEED = 1313


def _model(opset: int = 17) -> onnx.ModelProto:
    """x -> Conv -> Relu (read twice, and a graph output) -> MaxPool / Transpose -> Concat -> Conv -> y,
    plus Sub(const, h) and a dead-end Sigmoid output: shared-parameter ops, a tensor read by several
    nodes, a graph output that is also read, a tensor nobody reads."""
    rng = np.random.default_rng(SEED)

    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [init("w1", (8, 4, 3, 3)), init("b1", (8,), 0.1), init("w2", (6, 16, 1, 1)), init("b2", (6,), 0.1),
             init("c", (1, 6, 1, 1), 1.0), numpy_helper.from_array(np.array([0, 1, 3, 2], np.int64), "perm_shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[1, 1]),
        helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
        helper.make_node("Transpose", ["t"], ["t2"], name="transpose_back", perm=[0, 1, 3, 2]),
        helper.make_node("Concat", ["p", "t2"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w2", "b2"], ["z"], name="conv2"),
        helper.make_node("Sub", ["c", "z"], ["y"], name="sub"),
        helper.make_node("Sigmoid", ["z"], ["s"], name="sigmoid"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 6, 6]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 8, 6, 6]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 6, 6, 6])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


class _Reader:
    def __init__(self, n: int = 5):
        rng = np.random.default_rng(SEED + 1)
        self.feeds = [{"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(n)]

    def get_next(self):
        return self.feeds.pop(0) if self.feeds else None


def _quantize(tmp_path, model, name: str, **kw) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    src, dst = tmp_path / f"{name}_f.onnx", tmp_path / f"{name}_q.onnx"
    onnx.save(model, src)
    quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=["Conv", "Relu", "MaxPool", "Transpose", "Concat", "Sub", "Sigmoid"],
                    **kw)
    return onnx.load(dst)


def _qparams(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            out[n.name] = (inits[n.input[1]].tolist(), inits[n.input[2]].tolist(), str(inits[n.input[2]].dtype))
    return out


@pytest.mark.parametrize("opset,per_channel,method", [(17, True, "MinMax"), (13, False, "MinMax"),
                                                      (17, True, "Entropy")])
def test_quantized_model_is_onnxruntimes(tmp_path, opset, per_channel, method):
    from onnxruntime.quantization import CalibrationMethod

    kw = {"per_channel": per_channel, "calibrate_method": getattr(CalibrationMethod, method),
          "extra_options": {"ForceQuantizeNoInputCheck": True, "WeightSymmetric": True,
                            "ActivationSymmetric": False}}
    plain = _quantize(tmp_path, _model(opset), "plain", **kw)
    with linear_time_quantization():
        fast = _quantize(tmp_path, _model(opset), "fast", **kw)
    qp = _qparams(plain)
    assert len(qp) >= 20  # activations, weights and biases were quantized
    assert _qparams(fast) == qp
    assert fast.graph.SerializeToString() == plain.graph.SerializeToString()


@pytest.mark.parametrize("per_channel", [False, True])
def test_augmented_calibration_graph_is_onnxruntimes(tmp_path, per_channel):
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    def augmented(tag: str) -> onnx.ModelProto:
        src = tmp_path / f"{tag}.onnx"
        onnx.save(_model(), src)
        cal = MinMaxCalibrater(str(src), augmented_model_path=str(tmp_path / f"{tag}_aug.onnx"), per_channel=per_channel)
        cal.augment_graph()
        return onnx.load(tmp_path / f"{tag}_aug.onnx")

    plain = augmented("plain")
    with linear_time_quantization():
        fast = augmented("fast")
    uuid_names = {t.name for t in plain.graph.initializer} - {t.name for t in _model().graph.initializer}

    def shape(m, uuids):
        rename = {n: f"<helper{i}>" for i, n in enumerate(sorted(uuids, key=lambda n: [*_uses(m, n)]))}
        return [(n.op_type, n.name, [rename.get(i, i) for i in n.input], list(n.output),
                 [helper.get_attribute_value(a) for a in n.attribute]) for n in m.graph.node]

    fast_uuids = {t.name for t in fast.graph.initializer} - {t.name for t in _model().graph.initializer}
    assert len(plain.graph.node) > len(_model().graph.node) + 20
    assert shape(fast, fast_uuids) == shape(plain, uuid_names)
    assert [o.SerializeToString() for o in fast.graph.output] == [o.SerializeToString() for o in plain.graph.output]


def _uses(m: onnx.ModelProto, name: str) -> list[int]:
    return [i for i, n in enumerate(m.graph.node) if name in n.input]


def test_originals_restored_even_after_an_error():
    from onnxruntime.quantization import calibrate, qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    before = (calibrate.MinMaxCalibrater.augment_graph, ONNXModel.replace_input_of_all_nodes,
              ONNXModel.__dict__["replace_node_input"], ONNXModel.get_initializer, quant_utils.find_by_name,
              getattr(qdq_quantizer, "find_by_name", None))
    with pytest.raises(RuntimeError):
        with linear_time_quantization():
            assert ONNXModel.replace_input_of_all_nodes is not before[1]
            raise RuntimeError("boom")
    after = (calibrate.MinMaxCalibrater.augment_graph, ONNXModel.replace_input_of_all_nodes,
             ONNXModel.__dict__["replace_node_input"], ONNXModel.get_initializer, quant_utils.find_by_name,
             getattr(qdq_quantizer, "find_by_name", None))
    assert after == before


def test_streamed_sqnr_is_onnxruntimes(tmp_path):
    """The accuracy report's per-tensor SQNR, summed one sample at a time, equals onnxruntime's
    qdq_loss_debug figure over all samples at once."""
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations, compute_activation_error, create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    from fixer.quantize.accuracy import _ProbeRunner

    kw = {"per_channel": True, "extra_options": {"ForceQuantizeNoInputCheck": True, "WeightSymmetric": True}}
    quant = _quantize(tmp_path, _model(), "acc", **kw)
    feeds = _Reader(4).feeds
    rows = _ProbeRunner(_model(), quant, list(feeds), 1000).finish().rows
    ours = {r["tensor"]: r["sqnr_db"] for r in rows}
    ref = {}
    for tag, m in (("f", _model()), ("q", quant)):
        onnx.save(m, tmp_path / f"{tag}.onnx")
        modify_model_output_intermediate_tensors(str(tmp_path / f"{tag}.onnx"), str(tmp_path / f"{tag}_aug.onnx"))
        ref[tag] = collect_activations(str(tmp_path / f"{tag}_aug.onnx"), iter([dict(f) for f in feeds]))
    errors = compute_activation_error(create_activation_matching(ref["q"], ref["f"]))
    theirs = {k: float(v["xmodel_err"]) for k, v in errors.items() if "xmodel_err" in v}
    assert len(theirs) >= 5 and set(ours) == set(theirs)
    for k, v in theirs.items():
        assert ours[k] == pytest.approx(v, rel=1e-4, abs=1e-3), k


@pytest.mark.parametrize("method", ["MinMax", "Entropy", "Percentile"])
def test_calibration_without_spinning_is_onnxruntimes(tmp_path, method):
    """nafix's calibration sessions only let idle threads sleep: onnxruntime's own session options
    otherwise, and the quantized model byte for byte onnxruntime's; everything restored after."""
    import onnxruntime
    from onnxruntime.quantization import CalibrationMethod, calibrate

    from fixer.quantize.ort import _calibration_without_spinning

    kw = {"per_channel": True, "calibrate_method": getattr(CalibrationMethod, method),
          "extra_options": {"ForceQuantizeNoInputCheck": True, "WeightSymmetric": True}}
    plain = _quantize(tmp_path, _model(), "plain", **kw)
    before = calibrate.CalibraterBase.__dict__["create_inference_session"]
    onnx.save(_model(), tmp_path / "m.onnx")
    with _calibration_without_spinning():
        quiet = _quantize(tmp_path, _model(), "quiet", **kw)
        cal = calibrate.create_calibrator(str(tmp_path / "m.onnx"), calibrate_method=getattr(CalibrationMethod, method),
                                          augmented_model_path=str(tmp_path / "aug.onnx"))
        opts = cal.infer_session.get_session_options()
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert opts.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        assert calibrate.onnxruntime is onnxruntime  # swapped only while the session is created
    assert quiet.SerializeToString() == plain.SerializeToString()
    assert calibrate.CalibraterBase.__dict__["create_inference_session"] is before
    # without the block, onnxruntime's default (spinning) is back
    cal = calibrate.create_calibrator(str(tmp_path / "m.onnx"), augmented_model_path=str(tmp_path / "aug2.onnx"))
    with pytest.raises(RuntimeError, match="allow_spinning"):  # not set: onnxruntime's default
        cal.infer_session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
