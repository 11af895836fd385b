"""Helpers shared by the builder families: shape inference + checker, and ST-way quantization."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper

IR_VERSION = 8
CALIB_SAMPLES = 8


class GraphParts:
    """Nodes, initializers and graph inputs/outputs collected by a builder, with a seeded generator."""

    def __init__(self, family_seed: int, seed: int):
        self.rng = np.random.default_rng([family_seed, seed])
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(onnx.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name


def infer(m: onnx.ModelProto, *, data_prop: bool = False) -> onnx.ModelProto:
    """Strict shape inference (graph outputs declared without shape take the inferred one), then the
    full checker."""
    del m.graph.value_info[:]
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True, data_prop=data_prop)
    vi = {v.name: v for v in m.graph.value_info}
    for o in m.graph.output:
        if o.name in vi and not o.type.tensor_type.HasField("shape"):
            o.type.CopyFrom(vi[o.name].type)
    onnx.checker.check_model(m, full_check=True)
    return m


def quantize_st(m: onnx.ModelProto, rng: np.random.Generator, *, samples: int = CALIB_SAMPLES) -> onnx.ModelProto:
    """onnxruntime quantize_static the way ST users do (QDQ, int8 activations, symmetric per-channel
    int8 weights), calibrated on ``samples`` seeded standard-normal inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    data = [{k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()} for _ in range(samples)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

        def rewind(self):
            self.it = iter(data)

    level = logging.getLogger().level
    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer logs advice on the root logger
    try:
        with tempfile.TemporaryDirectory(prefix="nafix_builder_") as tmp:
            fp, qp = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
            onnx.save(m, str(fp))
            quantize_static(str(fp), str(qp), Reader(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                            extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
            q = onnx.load(str(qp))
    finally:
        logging.getLogger().setLevel(level)
    q.ir_version = IR_VERSION
    return q
