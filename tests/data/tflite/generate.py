"""Generate the small TFLite test models in this folder (committed; tests never run this).

    python tests/data/tflite/generate.py

Built with the flatbuffer builders of the ``tflite`` package (no TensorFlow): seeded weights, int8
per-axis weights and per-tensor activations as the TFLite converter writes them, scales chosen so
activations use their int8 range without saturating everywhere. The files:

* ``movenet_like.tflite``: MoveNet-shaped: float input -> QUANTIZE -> CONV_2D (RELU6) ->
  DEPTHWISE_CONV_2D (RELU) -> RESIZE_BILINEAR (half-pixel) -> CONV_2D -> LOGISTIC -> DEQUANTIZE -> float.
* ``int8_cnn.tflite``: int8 in and out: CONV_2D, DEPTHWISE_CONV_2D, MAX_POOL_2D, PAD, ADD,
  CONCATENATION, RESIZE_NEAREST_NEIGHBOR, AVERAGE_POOL_2D, MEAN, FULLY_CONNECTED, SOFTMAX.
* ``int8_misc.tflite``: uint8 input -> QUANTIZE, TRANSPOSE_CONV, PRELU, LEAKY_RELU, HARD_SWISH, MUL,
  STRIDED_SLICE, TRANSPOSE, RESHAPE, TILE (1x1 -> HxW), int8 output.
* ``int8_more.tflite``: SPLIT, RELU, RELU6, MAXIMUM, MINIMUM, TANH, CONCATENATION (axis -1),
  SPACE_TO_DEPTH, DEPTH_TO_SPACE, REDUCE_MAX, SUM, SLICE, PADV2, SQUEEZE, EXPAND_DIMS, GATHER, ARG_MAX,
  PACK, ADD with a fused RELU; six outputs (int8 and int32).
* ``float_model.tflite``: a float32 model: CONV_2D (RELU), DEPTHWISE_CONV_2D (RELU6), ADD, MEAN,
  FULLY_CONNECTED, DIV.
* ``int8_layout.tflite``: axis operators on tensors the import carries NCHW: CONCATENATION on H,
  PAD on W and C, STRIDED_SLICE with a shrink mask, MEAN over C, SOFTMAX on a 4-D tensor, SPLIT on
  W, SUB, TRANSPOSE of H and W, RESHAPE.
* ``uint8_model.tflite``: a TF1-style uint8 model (uint8 activations, asymmetric uint8 weights):
  CONV_2D (RELU6), AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX.
* ``custom_op.tflite``, ``flex_op.tflite``, ``float16.tflite``, ``unsupported_op.tflite``,
  ``hybrid.tflite`` (float activations with int8 weights): models
  nafix must refuse with one error sentence.
"""

from __future__ import annotations

import sys
from pathlib import Path

import flatbuffers
import numpy as np
import tflite

HERE = Path(__file__).resolve().parent
TYPES = {"float32": tflite.TensorType.FLOAT32, "float16": tflite.TensorType.FLOAT16,
         "int32": tflite.TensorType.INT32, "uint8": tflite.TensorType.UINT8, "int8": tflite.TensorType.INT8,
         "bool": tflite.TensorType.BOOL}
NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint8": np.uint8, "int8": np.int8,
      "bool": np.bool_}


class Model:
    """A one-subgraph TFLite model being described, then serialized by :meth:`build`."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.tensors: list[dict] = []
        self.ops: list[dict] = []
        self.codes: list[tuple[int, str]] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    # -- tensors ------------------------------------------------------------------------------
    def tensor(self, name, shape, dtype, *, data=None, scale=None, zp=None, qdim=0) -> int:
        self.tensors.append({"name": name, "shape": list(shape), "dtype": dtype, "data": data,
                             "scale": None if scale is None else list(np.atleast_1d(scale).astype(float)),
                             "zp": None if zp is None else list(np.atleast_1d(zp).astype(int)), "qdim": qdim})
        return len(self.tensors) - 1

    def act(self, name, shape, scale, zp, dtype="int8") -> int:
        return self.tensor(name, shape, dtype, scale=scale, zp=zp)

    def const(self, name, arr, dtype, **q) -> int:
        arr = np.asarray(arr).astype(NP[dtype])
        return self.tensor(name, arr.shape, dtype, data=arr, **q)

    def qweights(self, name, shape, qdim) -> int:
        w = self.rng.normal(0, 1, size=shape).astype(np.float32)
        axes = tuple(a for a in range(len(shape)) if a != qdim)
        scale = np.abs(w).max(axis=axes) / 127.0
        shp = [1] * len(shape)
        shp[qdim] = -1
        q = np.clip(np.rint(w / scale.reshape(shp)), -127, 127).astype(np.int8)
        return self.const(name, q, "int8", scale=scale, zp=np.zeros_like(scale, dtype=int), qdim=qdim)

    def bias(self, name, n, in_scale, w_t) -> int:
        ws = np.asarray(self.tensors[w_t]["scale"])
        scale = in_scale * ws
        b = self.rng.integers(-200, 200, size=n).astype(np.int32)
        return self.const(name, b, "int32", scale=scale, zp=np.zeros(n, dtype=int), qdim=0)

    def scale_of(self, t) -> float:
        return float(self.tensors[t]["scale"][0])

    # -- operators ----------------------------------------------------------------------------
    def op(self, name, inputs, outputs, options=None, fields=None, custom=None):
        code = getattr(tflite.BuiltinOperator, name)
        key = (code, custom or "")
        if key not in self.codes:
            self.codes.append(key)
        self.ops.append({"code": self.codes.index(key), "inputs": list(inputs), "outputs": list(outputs),
                         "options": options, "fields": fields or {}})
        return outputs[0]

    # -- serialization ------------------------------------------------------------------------
    def build(self) -> bytes:
        b = flatbuffers.Builder(4096)

        def ivec(start, values):
            start(b, len(values))
            for v in reversed(values):
                b.PrependInt32(int(v))
            return b.EndVector()

        buffers = [None]  # buffer 0 is the empty sentinel
        tensor_buf = []
        for t in self.tensors:
            if t["data"] is None:
                tensor_buf.append(0)
            else:
                tensor_buf.append(len(buffers))
                buffers.append(np.ascontiguousarray(t["data"]).tobytes())
        buf_offs = []
        for data in buffers:
            vec = b.CreateNumpyVector(np.frombuffer(data, np.uint8)) if data else None
            tflite.BufferStart(b)
            if vec is not None:
                tflite.BufferAddData(b, vec)
            buf_offs.append(tflite.BufferEnd(b))
        t_offs = []
        for i, t in enumerate(self.tensors):
            name = b.CreateString(t["name"])
            shape = ivec(tflite.TensorStartShapeVector, t["shape"])
            quant = None
            if t["scale"] is not None:
                tflite.QuantizationParametersStartScaleVector(b, len(t["scale"]))
                for v in reversed(t["scale"]):
                    b.PrependFloat32(float(v))
                sv = b.EndVector()
                tflite.QuantizationParametersStartZeroPointVector(b, len(t["zp"]))
                for v in reversed(t["zp"]):
                    b.PrependInt64(int(v))
                zv = b.EndVector()
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, sv)
                tflite.QuantizationParametersAddZeroPoint(b, zv)
                tflite.QuantizationParametersAddQuantizedDimension(b, t["qdim"])
                quant = tflite.QuantizationParametersEnd(b)
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, TYPES[t["dtype"]])
            tflite.TensorAddBuffer(b, tensor_buf[i])
            tflite.TensorAddName(b, name)
            if quant is not None:
                tflite.TensorAddQuantization(b, quant)
            t_offs.append(tflite.TensorEnd(b))
        op_offs = []
        for o in self.ops:
            opts = None
            if o["options"]:
                cls = o["options"]
                getattr(tflite, cls + "Start")(b)
                for k, v in o["fields"].items():
                    getattr(tflite, f"{cls}Add{k}")(b, v)
                opts = getattr(tflite, cls + "End")(b)
            ins = ivec(tflite.OperatorStartInputsVector, o["inputs"])
            outs = ivec(tflite.OperatorStartOutputsVector, o["outputs"])
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, o["code"])
            tflite.OperatorAddInputs(b, ins)
            tflite.OperatorAddOutputs(b, outs)
            if opts is not None:
                tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, o["options"]))
                tflite.OperatorAddBuiltinOptions(b, opts)
            op_offs.append(tflite.OperatorEnd(b))

        def table_vec(start, offs):
            start(b, len(offs))
            for off in reversed(offs):
                b.PrependUOffsetTRelative(off)
            return b.EndVector()

        tensors = table_vec(tflite.SubGraphStartTensorsVector, t_offs)
        ops = table_vec(tflite.SubGraphStartOperatorsVector, op_offs)
        ins = ivec(tflite.SubGraphStartInputsVector, self.inputs)
        outs = ivec(tflite.SubGraphStartOutputsVector, self.outputs)
        sg_name = b.CreateString("main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tensors)
        tflite.SubGraphAddOperators(b, ops)
        tflite.SubGraphAddInputs(b, ins)
        tflite.SubGraphAddOutputs(b, outs)
        tflite.SubGraphAddName(b, sg_name)
        sg = tflite.SubGraphEnd(b)
        code_offs = []
        for code, custom in self.codes:
            cc = b.CreateString(custom) if custom else None
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
            tflite.OperatorCodeAddBuiltinCode(b, code)
            tflite.OperatorCodeAddVersion(b, VERSIONS.get(code, 1))
            if cc is not None:
                tflite.OperatorCodeAddCustomCode(b, cc)
            code_offs.append(tflite.OperatorCodeEnd(b))
        codes = table_vec(tflite.ModelStartOperatorCodesVector, code_offs)
        subgraphs = table_vec(tflite.ModelStartSubgraphsVector, [sg])
        bufs = table_vec(tflite.ModelStartBuffersVector, buf_offs)
        desc = b.CreateString("nafix test model (tests/data/tflite/generate.py)")
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, codes)
        tflite.ModelAddSubgraphs(b, subgraphs)
        tflite.ModelAddBuffers(b, bufs)
        tflite.ModelAddDescription(b, desc)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())


#: Operator versions other than 1 (LiteRT registers BROADCAST_TO from version 2).
VERSIONS = {tflite.BuiltinOperator.BROADCAST_TO: 2}
SAME, VALID = tflite.Padding.SAME, tflite.Padding.VALID
RELU, RELU6, NONE = (tflite.ActivationFunctionType.RELU, tflite.ActivationFunctionType.RELU6,
                     tflite.ActivationFunctionType.NONE)


def conv(m, name, x, cin, cout, k, stride, in_scale, out_scale, out_zp, act=NONE, shape=None):
    w = m.qweights(name + "/weights", (cout, k, k, cin), 0)
    bias = m.bias(name + "/bias", cout, in_scale, w)
    y = m.act(name, shape, out_scale, out_zp)
    m.op("CONV_2D", [x, w, bias], [y], "Conv2DOptions",
         {"Padding": SAME, "StrideW": stride, "StrideH": stride, "FusedActivationFunction": act,
          "DilationWFactor": 1, "DilationHFactor": 1})
    return y


def depthwise(m, name, x, c, k, stride, in_scale, out_scale, out_zp, act=NONE, shape=None):
    w = m.qweights(name + "/weights", (1, k, k, c), 3)
    bias = m.bias(name + "/bias", c, in_scale, w)
    y = m.act(name, shape, out_scale, out_zp)
    m.op("DEPTHWISE_CONV_2D", [x, w, bias], [y], "DepthwiseConv2DOptions",
         {"Padding": SAME, "StrideW": stride, "StrideH": stride, "DepthMultiplier": 1,
          "FusedActivationFunction": act, "DilationWFactor": 1, "DilationHFactor": 1})
    return y


def movenet_like() -> bytes:
    m = Model(seed=1)
    x = m.tensor("input", (1, 32, 32, 3), "float32")
    q = m.act("input_int8", (1, 32, 32, 3), 1 / 128, 0)
    m.op("QUANTIZE", [x], [q])
    c1 = conv(m, "conv1", q, 3, 8, 3, 2, 1 / 128, 6 / 255, -128, RELU6, (1, 16, 16, 8))
    d1 = depthwise(m, "dw1", c1, 8, 3, 1, 6 / 255, 0.05, -128, RELU, (1, 16, 16, 8))
    size = m.const("resize/size", [32, 32], "int32")
    r = m.act("resize", (1, 32, 32, 8), 0.05, -128)
    m.op("RESIZE_BILINEAR", [d1, size], [r], "ResizeBilinearOptions",
         {"AlignCorners": False, "HalfPixelCenters": True})
    c2 = conv(m, "heatmap_logits", r, 8, 4, 1, 1, 0.05, 0.08, 0, NONE, (1, 32, 32, 4))
    s = m.act("heatmap_int8", (1, 32, 32, 4), 1 / 256, -128)
    m.op("LOGISTIC", [c2], [s])
    out = m.tensor("heatmap", (1, 32, 32, 4), "float32")
    m.op("DEQUANTIZE", [s], [out])
    m.inputs, m.outputs = [x], [out]
    return m.build()


def int8_cnn() -> bytes:
    m = Model(seed=2)
    x = m.act("input", (1, 16, 16, 4), 1 / 64, 3)
    c1 = conv(m, "conv1", x, 4, 8, 3, 1, 1 / 64, 0.04, -20, RELU, (1, 16, 16, 8))
    d1 = depthwise(m, "dw1", c1, 8, 3, 1, 0.04, 0.06, 5, NONE, (1, 16, 16, 8))
    p = m.act("maxpool", (1, 8, 8, 8), 0.06, 5)
    m.op("MAX_POOL_2D", [d1], [p], "Pool2DOptions",
         {"Padding": VALID, "StrideW": 2, "StrideH": 2, "FilterWidth": 2, "FilterHeight": 2})
    pads = m.const("pad/paddings", [[0, 0], [1, 1], [1, 1], [0, 0]], "int32")
    pd = m.act("pad", (1, 10, 10, 8), 0.06, 5)
    m.op("PAD", [p, pads], [pd])
    c2 = conv(m, "conv2", pd, 8, 8, 3, 1, 0.06, 0.07, -3, NONE, (1, 10, 10, 8))
    a = m.act("add", (1, 10, 10, 8), 0.06, 5)  # TFLite's int8 CONCATENATION needs equal scales
    m.op("ADD", [c2, pd], [a], "AddOptions", {"FusedActivationFunction": NONE})
    cat = m.act("concat", (1, 10, 10, 16), 0.06, 5)
    m.op("CONCATENATION", [a, pd], [cat], "ConcatenationOptions", {"Axis": 3, "FusedActivationFunction": NONE})
    size = m.const("up/size", [20, 20], "int32")
    up = m.act("upsample", (1, 20, 20, 16), 0.06, 5)
    m.op("RESIZE_NEAREST_NEIGHBOR", [cat, size], [up], "ResizeNearestNeighborOptions",
         {"AlignCorners": False, "HalfPixelCenters": True})
    ap = m.act("avgpool", (1, 10, 10, 16), 0.06, 5)
    m.op("AVERAGE_POOL_2D", [up, ], [ap], "Pool2DOptions",
         {"Padding": SAME, "StrideW": 2, "StrideH": 2, "FilterWidth": 3, "FilterHeight": 3})
    axes = m.const("mean/axes", [1, 2], "int32")
    mean = m.act("mean", (1, 16), 0.03, -2)
    m.op("MEAN", [ap, axes], [mean], "ReducerOptions", {"KeepDims": False})
    fw = m.qweights("fc/weights", (10, 16), 0)
    fb = m.bias("fc/bias", 10, 0.03, fw)
    fc = m.act("fc", (1, 10), 0.15, 4)
    m.op("FULLY_CONNECTED", [mean, fw, fb], [fc], "FullyConnectedOptions", {"FusedActivationFunction": NONE})
    sm = m.act("softmax", (1, 10), 1 / 256, -128)
    m.op("SOFTMAX", [fc], [sm], "SoftmaxOptions", {"Beta": 1.0})
    m.inputs, m.outputs = [x], [sm]
    return m.build()


def int8_misc() -> bytes:
    m = Model(seed=3)
    x = m.act("input_uint8", (1, 8, 8, 4), 1 / 32, 128, dtype="uint8")
    q = m.act("input_int8", (1, 8, 8, 4), 1 / 32, 0)
    m.op("QUANTIZE", [x], [q])
    w = m.qweights("deconv/weights", (6, 3, 3, 4), 0)
    oshape = m.const("deconv/output_shape", [1, 16, 16, 6], "int32")
    b = m.bias("deconv/bias", 6, 1 / 32, w)
    dc = m.act("deconv", (1, 16, 16, 6), 0.08, -10)
    m.op("TRANSPOSE_CONV", [oshape, w, q, b], [dc], "TransposeConvOptions",
         {"Padding": SAME, "StrideW": 2, "StrideH": 2})
    alpha = m.const("prelu/alpha", m.rng.integers(1, 60, size=(1, 1, 6)), "int8", scale=0.01, zp=0)
    pr = m.act("prelu", (1, 16, 16, 6), 0.06, -60)
    m.op("PRELU", [dc, alpha], [pr])
    lr = m.act("leaky", (1, 16, 16, 6), 0.06, -40)
    m.op("LEAKY_RELU", [pr], [lr], "LeakyReluOptions", {"Alpha": 0.2})
    hs = m.act("hard_swish", (1, 16, 16, 6), 0.05, -50)
    m.op("HARD_SWISH", [lr], [hs])
    mul = m.act("mul", (1, 16, 16, 6), 0.04, -30)
    m.op("MUL", [hs, lr], [mul], "MulOptions", {"FusedActivationFunction": NONE})
    begin = m.const("slice/begin", [0, 2, 0, 1], "int32")
    end = m.const("slice/end", [1, 14, 16, 5], "int32")
    strides = m.const("slice/strides", [1, 1, 2, 1], "int32")
    sl = m.act("strided_slice", (1, 12, 8, 4), 0.04, -30)
    m.op("STRIDED_SLICE", [mul, begin, end, strides], [sl], "StridedSliceOptions",
         {"BeginMask": 0, "EndMask": 0, "ShrinkAxisMask": 0})
    pool_axes = m.const("gap/axes", [1, 2], "int32")
    gap = m.act("gap", (1, 1, 1, 4), 0.03, -20)
    m.op("MEAN", [sl, pool_axes], [gap], "ReducerOptions", {"KeepDims": True})
    mult = m.const("tile/multiples", [1, 12, 8, 1], "int32")
    tl = m.act("tile", (1, 12, 8, 4), 0.03, -20)
    m.op("TILE", [gap, mult], [tl])
    add = m.act("add", (1, 12, 8, 4), 0.05, -10)
    m.op("ADD", [tl, sl], [add], "AddOptions", {"FusedActivationFunction": NONE})
    perm = m.const("transpose/perm", [0, 3, 1, 2], "int32")
    tr = m.act("transpose", (1, 4, 12, 8), 0.05, -10)
    m.op("TRANSPOSE", [add, perm], [tr])
    shape = m.const("reshape/shape", [1, 4, 96], "int32")
    rs = m.act("output", (1, 4, 96), 0.05, -10)
    m.op("RESHAPE", [tr, shape], [rs])
    m.inputs, m.outputs = [x], [rs]
    return m.build()


def int8_more() -> bytes:
    m = Model(seed=7)
    s, z = 1 / 32, 0
    x = m.act("input", (1, 8, 8, 8), s, z)
    axis = m.const("split/axis", 3, "int32")
    a = m.act("split_a", (1, 8, 8, 4), s, z)
    b = m.act("split_b", (1, 8, 8, 4), s, z)
    m.op("SPLIT", [axis, x], [a, b], "SplitOptions", {"NumSplits": 2})
    ra = m.act("relu", (1, 8, 8, 4), s, -128)
    m.op("RELU", [a], [ra])
    rb = m.act("relu6", (1, 8, 8, 4), 6 / 255, -128)
    m.op("RELU6", [b], [rb])
    mx = m.act("maximum", (1, 8, 8, 4), s, z)
    m.op("MAXIMUM", [a, b], [mx])
    mn = m.act("minimum", (1, 8, 8, 4), s, z)
    m.op("MINIMUM", [a, b], [mn])
    th = m.act("tanh", (1, 8, 8, 4), 1 / 128, 0)
    m.op("TANH", [mx], [th])
    cat = m.act("concat", (1, 8, 8, 8), s, z)
    m.op("CONCATENATION", [mx, mn], [cat], "ConcatenationOptions", {"Axis": -1, "FusedActivationFunction": NONE})
    s2d = m.act("space_to_depth", (1, 4, 4, 32), s, z)
    m.op("SPACE_TO_DEPTH", [cat], [s2d], "SpaceToDepthOptions", {"BlockSize": 2})
    d2s = m.act("depth_to_space", (1, 8, 8, 8), s, z)
    m.op("DEPTH_TO_SPACE", [s2d], [d2s], "DepthToSpaceOptions", {"BlockSize": 2})
    rmax_axes = m.const("reduce_max/axes", [3], "int32")
    rmax = m.act("reduce_max", (1, 8, 8, 1), s, z)
    m.op("REDUCE_MAX", [d2s, rmax_axes], [rmax], "ReducerOptions", {"KeepDims": True})
    sum_axes = m.const("sum/axes", [1, 2], "int32")
    sm = m.act("sum", (1, 8), 2.0, 0)
    m.op("SUM", [d2s, sum_axes], [sm], "ReducerOptions", {"KeepDims": False})
    begin = m.const("slice/begin", [0, 1, 1, 0], "int32")
    size = m.const("slice/size", [1, 6, 6, -1], "int32")
    sl = m.act("slice", (1, 6, 6, 8), s, z)
    m.op("SLICE", [cat, begin, size], [sl])
    pads = m.const("padv2/paddings", [[0, 0], [1, 1], [1, 1], [0, 0]], "int32")
    pval = m.const("padv2/value", [12], "int8", scale=s, zp=z)
    pv = m.act("padv2", (1, 8, 8, 8), s, z)
    m.op("PADV2", [sl, pads, pval], [pv])
    sq = m.act("squeeze", (8, 8), s, z)
    m.op("SQUEEZE", [rmax], [sq], "SqueezeOptions", {})
    ed_axis = m.const("expand_dims/axis", [0], "int32")
    ed = m.act("expand_dims", (1, 8, 8), s, z)
    m.op("EXPAND_DIMS", [sq, ed_axis], [ed])
    idx = m.const("gather/indices", [0, 2, 5], "int32")
    ga = m.act("gather", (1, 3, 8), s, z)
    m.op("GATHER", [ed, idx], [ga], "GatherOptions", {"Axis": 1})
    am_axis = m.const("arg_max/axis", [1], "int32")
    am = m.tensor("arg_max", (1,), "int32")
    m.op("ARG_MAX", [sm, am_axis], [am], "ArgMaxOptions", {"OutputType": tflite.TensorType.INT32})
    pk = m.act("pack", (2, 1, 8), 2.0, 0)
    m.op("PACK", [sm, sm], [pk], "PackOptions", {"ValuesCount": 2, "Axis": 0})
    add = m.act("add_relu", (1, 8, 8, 4), 0.05, -128)
    m.op("ADD", [ra, rb], [add], "AddOptions", {"FusedActivationFunction": RELU})
    m.inputs, m.outputs = [x], [th, pv, ga, am, pk, add]
    return m.build()


def float_model() -> bytes:
    m = Model(seed=8)
    rng = m.rng
    x = m.tensor("input", (1, 8, 8, 3), "float32")
    w = m.const("conv/weights", rng.normal(0, 0.5, (6, 3, 3, 3)), "float32")
    b = m.const("conv/bias", rng.normal(0, 0.1, 6), "float32")
    c = m.tensor("conv", (1, 4, 4, 6), "float32")
    m.op("CONV_2D", [x, w, b], [c], "Conv2DOptions",
         {"Padding": SAME, "StrideW": 2, "StrideH": 2, "FusedActivationFunction": RELU,
          "DilationWFactor": 1, "DilationHFactor": 1})
    dw = m.const("dw/weights", rng.normal(0, 0.5, (1, 3, 3, 6)), "float32")
    db = m.const("dw/bias", rng.normal(0, 0.1, 6), "float32")
    d = m.tensor("dw", (1, 4, 4, 6), "float32")
    m.op("DEPTHWISE_CONV_2D", [c, dw, db], [d], "DepthwiseConv2DOptions",
         {"Padding": SAME, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 1,
          "FusedActivationFunction": RELU6, "DilationWFactor": 1, "DilationHFactor": 1})
    a = m.tensor("add", (1, 4, 4, 6), "float32")
    m.op("ADD", [c, d], [a], "AddOptions", {"FusedActivationFunction": NONE})
    axes = m.const("mean/axes", [1, 2], "int32")
    mean = m.tensor("mean", (1, 6), "float32")
    m.op("MEAN", [a, axes], [mean], "ReducerOptions", {"KeepDims": False})
    fw = m.const("fc/weights", rng.normal(0, 0.5, (4, 6)), "float32")
    fb = m.const("fc/bias", rng.normal(0, 0.1, 4), "float32")
    fc = m.tensor("fc", (1, 4), "float32")
    m.op("FULLY_CONNECTED", [mean, fw, fb], [fc], "FullyConnectedOptions", {"FusedActivationFunction": NONE})
    den = m.const("div/denominator", [2.0, 4.0, 0.5, 8.0], "float32")
    out = m.tensor("output", (1, 4), "float32")
    m.op("DIV", [fc, den], [out], "DivOptions", {"FusedActivationFunction": NONE})
    m.inputs, m.outputs = [x], [out]
    return m.build()


def int8_layout() -> bytes:
    """Axis operators on activations carried NCHW inside the import: each axis must be remapped."""
    m = Model(seed=11)
    s, z = 0.05, -5
    x = m.act("input", (1, 6, 6, 4), 1 / 32, 0)
    c = conv(m, "conv", x, 4, 4, 1, 1, 1 / 32, s, z, NONE, (1, 6, 6, 4))
    cat = m.act("concat_h", (1, 12, 6, 4), s, z)
    m.op("CONCATENATION", [c, c], [cat], "ConcatenationOptions", {"Axis": 1, "FusedActivationFunction": NONE})
    pads = m.const("pad_c/paddings", [[0, 0], [0, 0], [1, 0], [0, 4]], "int32")
    pc = m.act("pad_c", (1, 12, 7, 8), s, z)
    m.op("PAD", [cat, pads], [pc])
    begin = m.const("shrink/begin", [0, 3, 0, 0], "int32")
    end = m.const("shrink/end", [1, 4, 7, 8], "int32")
    strides = m.const("shrink/strides", [1, 1, 1, 1], "int32")
    sh = m.act("shrink", (1, 7, 8), s, z)
    m.op("STRIDED_SLICE", [pc, begin, end, strides], [sh], "StridedSliceOptions",
         {"BeginMask": 0, "EndMask": 0, "ShrinkAxisMask": 2})
    axes = m.const("mean_c/axes", [3], "int32")
    mc = m.act("mean_c", (1, 6, 6), 0.03, 0)
    m.op("MEAN", [c, axes], [mc], "ReducerOptions", {"KeepDims": False})
    sm = m.act("softmax_c", (1, 6, 6, 4), 1 / 256, -128)
    m.op("SOFTMAX", [c], [sm], "SoftmaxOptions", {"Beta": 1.0})
    axis = m.const("split_w/axis", 2, "int32")
    w0 = m.act("split_w0", (1, 6, 3, 4), s, z)
    w1 = m.act("split_w1", (1, 6, 3, 4), s, z)
    m.op("SPLIT", [axis, c], [w0, w1], "SplitOptions", {"NumSplits": 2})
    sub = m.act("sub", (1, 6, 3, 4), 0.08, 0)
    m.op("SUB", [w0, w1], [sub], "SubOptions", {"FusedActivationFunction": NONE})
    perm = m.const("transpose_hw/perm", [0, 2, 1, 3], "int32")
    tr = m.act("transpose_hw", (1, 3, 6, 4), 0.08, 0)
    m.op("TRANSPOSE", [sub, perm], [tr])
    shape = m.const("flatten/shape", [1, 72], "int32")
    fl = m.act("flatten", (1, 72), 0.08, 0)
    m.op("RESHAPE", [tr, shape], [fl])
    m.inputs, m.outputs = [x], [sh, mc, sm, fl]
    return m.build()


def uint8_model() -> bytes:
    """A TF1-style uint8 model: uint8 activations and asymmetric uint8 weights, per tensor."""
    m = Model(seed=9)
    x = m.act("input", (1, 8, 8, 3), 1 / 128, 128, dtype="uint8")
    wf = m.rng.normal(0, 1, (4, 3, 3, 3))
    ws = float(wf.max() - wf.min()) / 255
    wz = int(round(-wf.min() / ws))
    w = m.const("conv/weights", np.clip(np.rint(wf / ws) + wz, 0, 255), "uint8", scale=ws, zp=wz)
    b = m.const("conv/bias", m.rng.integers(-100, 100, 4), "int32", scale=ws / 128, zp=0)
    c = m.act("conv", (1, 8, 8, 4), 0.05, 120, dtype="uint8")
    m.op("CONV_2D", [x, w, b], [c], "Conv2DOptions",
         {"Padding": SAME, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": RELU6,
          "DilationWFactor": 1, "DilationHFactor": 1})
    p = m.act("avgpool", (1, 4, 4, 4), 0.05, 120, dtype="uint8")
    m.op("AVERAGE_POOL_2D", [c], [p], "Pool2DOptions",
         {"Padding": VALID, "StrideW": 2, "StrideH": 2, "FilterWidth": 2, "FilterHeight": 2})
    shape = m.const("reshape/shape", [1, 64], "int32")
    r = m.act("flatten", (1, 64), 0.05, 120, dtype="uint8")
    m.op("RESHAPE", [p, shape], [r])
    fwf = m.rng.normal(0, 0.3, (5, 64))
    fs = float(fwf.max() - fwf.min()) / 255
    fz = int(round(-fwf.min() / fs))
    fw = m.const("fc/weights", np.clip(np.rint(fwf / fs) + fz, 0, 255), "uint8", scale=fs, zp=fz)
    fb = m.const("fc/bias", m.rng.integers(-100, 100, 5), "int32", scale=fs * 0.05, zp=0)
    fc = m.act("fc", (1, 5), 0.1, 128, dtype="uint8")
    m.op("FULLY_CONNECTED", [r, fw, fb], [fc], "FullyConnectedOptions", {"FusedActivationFunction": NONE})
    sm = m.act("softmax", (1, 5), 1 / 256, 0, dtype="uint8")
    m.op("SOFTMAX", [fc], [sm], "SoftmaxOptions", {"Beta": 1.0})
    m.inputs, m.outputs = [x], [sm]
    return m.build()


def hybrid() -> bytes:
    """Dynamic-range quantization: float activations, int8 weights (refused)."""
    m = Model(seed=10)
    x = m.tensor("input", (1, 16), "float32")
    w = m.qweights("fc/weights", (4, 16), 0)
    y = m.tensor("output", (1, 4), "float32")
    m.op("FULLY_CONNECTED", [x, w, -1], [y], "FullyConnectedOptions", {"FusedActivationFunction": NONE})
    m.inputs, m.outputs = [x], [y]
    return m.build()


def custom_op(flex: bool) -> bytes:
    m = Model(seed=4)
    x = m.tensor("input", (1, 4), "float32")
    y = m.tensor("output", (1, 4), "float32")
    m.op("CUSTOM", [x], [y], custom="FlexAddV2" if flex else "MyCustomOp")
    m.inputs, m.outputs = [x], [y]
    return m.build()


def float16() -> bytes:
    m = Model(seed=5)
    x = m.tensor("input", (1, 4, 4, 2), "float32")
    w16 = m.const("weights_fp16", m.rng.normal(size=(3, 1, 1, 2)), "float16")
    w = m.tensor("weights", (3, 1, 1, 2), "float32")
    m.op("DEQUANTIZE", [w16], [w])
    y = m.tensor("output", (1, 4, 4, 3), "float32")
    m.op("CONV_2D", [x, w], [y], "Conv2DOptions", {"Padding": SAME, "StrideW": 1, "StrideH": 1})
    m.inputs, m.outputs = [x], [y]
    return m.build()


def unsupported_op() -> bytes:
    m = Model(seed=6)
    x = m.tensor("input", (1, 4), "float32")
    y = m.tensor("output", (1, 4), "float32")
    m.op("UNIQUE", [x], [y])
    m.inputs, m.outputs = [x], [y]
    return m.build()


# -- calibrated int8 models: every activation's scale from a float pass on a seeded input ----------------


def _qparams(v: np.ndarray) -> tuple[float, int]:
    """Asymmetric int8 parameters covering ``v`` (and 0), as a post-training calibration picks them."""
    lo, hi = min(float(v.min()), 0.0), max(float(v.max()), 0.0)
    scale = max(hi - lo, 1e-6) / 255.0
    return scale, int(np.clip(round(-128 - lo / scale), -128, 127))


class Traced:
    """Builds a TFLite model while computing each tensor's (dequantized) value on one input, so each
    activation gets the scale a calibration would give it (values use the int8 range, none saturate)."""

    def __init__(self, m: Model):
        self.m, self.val = m, {}

    def input(self, name, shape, scale, zp):
        t = self.m.act(name, shape, scale, zp)
        self.val[t] = (self.m.rng.integers(-128, 128, size=shape) - zp) * scale
        return t

    def const(self, name, arr):
        arr = np.asarray(arr, np.float64)
        s, z = _qparams(arr)
        q = np.clip(np.rint(arr / s) + z, -128, 127)
        t = self.m.const(name, q, "int8", scale=s, zp=z)
        self.val[t] = (q - z) * s
        return t

    def op(self, opname, ins, fn, name, options=None, fields=None, q=None):
        v = np.asarray(fn(*[self.val[i] for i in ins]), np.float64)
        s, z = q or _qparams(np.concatenate([1.5 * v.reshape(-1), [0.0]]))  # headroom: other inputs, same range
        t = self.m.act(name, v.shape, s, z)
        self.m.op(opname, ins, [t], options, fields)
        self.val[t] = (np.clip(np.rint(v / s) + z, -128, 127) - z) * s
        return t

    def plain(self, t, value):
        """Record the value of a tensor made outside :meth:`op` (int32/bool outputs, constants)."""
        self.val[t] = np.asarray(value)
        return t

    def fc(self, name, x, n_out, act=NONE):
        xs = self.m.tensors[x]["shape"]
        w = self.m.qweights(name + "/weights", (n_out, xs[-1]), 0)
        b = self.m.bias(name + "/bias", n_out, self.m.scale_of(x), w)
        wv = self.m.tensors[w]["data"] * np.asarray(self.m.tensors[w]["scale"])[:, None]
        bv = self.m.tensors[b]["data"] * np.asarray(self.m.tensors[b]["scale"])
        relu = (lambda v: np.maximum(v, 0)) if act == RELU else (lambda v: v)
        self.val[w], self.val[b] = wv, bv
        return self.op("FULLY_CONNECTED", [x, w, b], lambda xv, wv, bv: relu(xv @ wv.T + bv), name,
                       "FullyConnectedOptions", {"FusedActivationFunction": act, "KeepNumDims": True})

    def layer_norm(self, name, x, squared_difference: bool):
        """TFLite's LayerNorm: MEAN, SUB, (SQUARED_DIFFERENCE or MUL), MEAN, ADD eps, RSQRT, MUL, MUL, ADD."""
        c = self.m.tensors[x]["shape"][-1]
        ax = self.m.const(name + "/axes", [-1], "int32")
        self.val[ax] = None
        mean = lambda v, _=None: v.mean(axis=-1, keepdims=True)  # noqa: E731
        mu = self.op("MEAN", [x, ax], mean, name + "/mean", "ReducerOptions", {"KeepDims": True})
        d = self.op("SUB", [x, mu], np.subtract, name + "/centered", "SubOptions", {"FusedActivationFunction": NONE})
        if squared_difference:
            sq = self.op("SQUARED_DIFFERENCE", [x, mu], lambda a, b: (a - b) ** 2, name + "/squared_difference")
        else:
            sq = self.op("MUL", [d, d], np.multiply, name + "/square", "MulOptions", {"FusedActivationFunction": NONE})
        var = self.op("MEAN", [sq, ax], mean, name + "/variance", "ReducerOptions", {"KeepDims": True})
        eps = self.const(name + "/epsilon", [1e-3])
        ve = self.op("ADD", [var, eps], np.add, name + "/add_eps", "AddOptions", {"FusedActivationFunction": NONE})
        r = self.op("RSQRT", [ve], lambda v: 1 / np.sqrt(v), name + "/rsqrt")
        n = self.op("MUL", [d, r], np.multiply, name + "/normalized", "MulOptions", {"FusedActivationFunction": NONE})
        g = self.const(name + "/gamma", self.m.rng.uniform(0.5, 1.5, c))
        gn = self.op("MUL", [n, g], np.multiply, name + "/scaled", "MulOptions", {"FusedActivationFunction": NONE})
        be = self.const(name + "/beta", self.m.rng.normal(0, 0.2, c))
        return self.op("ADD", [gn, be], np.add, name, "AddOptions", {"FusedActivationFunction": NONE})

    def reshape(self, name, x, shape):
        st = self.m.const(name + "/shape", shape, "int32")
        self.val[st] = None
        return self.op("RESHAPE", [x, st], lambda v, _: v.reshape(shape), name,
                       q=self._same(x))

    def transpose(self, name, x, perm):
        pt = self.m.const(name + "/perm", perm, "int32")
        self.val[pt] = None
        return self.op("TRANSPOSE", [x, pt], lambda v, _: v.transpose(perm), name, q=self._same(x))

    def _same(self, t):
        return self.m.scale_of(t), int(self.m.tensors[t]["zp"][0])


def _softmax(v, axis=-1):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _gelu(v, approximate=False):
    if approximate:
        return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    from math import erf
    return 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2)))


def int8_transformer() -> bytes:
    """A ViT encoder block, int8 as the TFLite converter writes it: LayerNorm (MEAN, SUB,
    SQUARED_DIFFERENCE / MUL, RSQRT), two-head self-attention (FULLY_CONNECTED q/k/v, RESHAPE,
    TRANSPOSE, BATCH_MATMUL with adj_y, MUL by 1/sqrt(d), SOFTMAX, BATCH_MATMUL), a GELU MLP and the two
    residual ADDs."""
    m = Model(seed=21)
    tr = Traced(m)
    tokens, dim, heads = 16, 32, 2
    hd = dim // heads
    x = tr.input("tokens", (1, tokens, dim), 1 / 32, 0)
    ln1 = tr.layer_norm("ln1", x, squared_difference=True)
    q, k, v = (tr.fc(f"attn/{n}", ln1, dim) for n in "qkv")
    qh, kh, vh = (tr.transpose(f"attn/{n}_heads", tr.reshape(f"attn/{n}_split", t, [1, tokens, heads, hd]),
                               [0, 2, 1, 3]) for n, t in zip("qkv", (q, k, v)))
    scores = tr.op("BATCH_MATMUL", [qh, kh], lambda a, b: a @ np.swapaxes(b, -1, -2), "attn/scores",
                   "BatchMatMulOptions", {"AdjX": False, "AdjY": True})
    scale = tr.const("attn/scale", [0.1 / np.sqrt(hd)])  # (a softer softmax than 1/sqrt(d) on random weights)
    scaled = tr.op("MUL", [scores, scale], np.multiply, "attn/scaled", "MulOptions", {"FusedActivationFunction": NONE})
    probs = tr.op("SOFTMAX", [scaled], _softmax, "attn/softmax", "SoftmaxOptions", {"Beta": 1.0}, q=(1 / 256, -128))
    ctx = tr.op("BATCH_MATMUL", [probs, vh], np.matmul, "attn/context", "BatchMatMulOptions",
                {"AdjX": False, "AdjY": False})
    merged = tr.reshape("attn/merge", tr.transpose("attn/context_tokens", ctx, [0, 2, 1, 3]), [1, tokens, dim])
    proj = tr.fc("attn/proj", merged, dim)
    res1 = tr.op("ADD", [x, proj], np.add, "residual1", "AddOptions", {"FusedActivationFunction": NONE})
    ln2 = tr.layer_norm("ln2", res1, squared_difference=False)
    h = tr.fc("mlp/fc1", ln2, 2 * dim)
    g = tr.op("GELU", [h], _gelu, "mlp/gelu", "GeluOptions", {"Approximate": False})
    o = tr.fc("mlp/fc2", g, dim)
    out = tr.op("ADD", [res1, o], np.add, "output", "AddOptions", {"FusedActivationFunction": NONE})
    m.inputs, m.outputs = [x], [out]
    return m.build()


def _conv1x1(v, w, b):
    return v @ w.T + b


def _depthwise_valid(v, w, b):
    """NHWC depthwise convolution, VALID padding, stride 1 (w: [1, kh, kw, c])."""
    _, kh, kw, _ = w.shape
    n, h, wd, c = v.shape
    out = np.zeros((n, h - kh + 1, wd - kw + 1, c))
    for i in range(kh):
        for j in range(kw):
            out += v[:, i:i + h - kh + 1, j:j + wd - kw + 1, :] * w[0, i, j, :]
    return out + b


def _space_to_batch(v, block, pads):
    (bh, bw), ((pt, pb), (pl, pr)) = block, pads
    v = np.pad(v, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, h, w, c = v.shape
    v = v.reshape(n, h // bh, bh, w // bw, bw, c).transpose(2, 4, 0, 1, 3, 5)
    return v.reshape(bh * bw * n, h // bh, w // bw, c)


def _batch_to_space(v, block):
    bh, bw = block
    b, h, w, c = v.shape
    n = b // (bh * bw)
    return v.reshape(bh, bw, n, h, w, c).transpose(2, 3, 0, 4, 1, 5).reshape(n, h * bh, w * bw, c)


def int8_ops() -> bytes:
    """The other int8 operators of LiteRT's builtin set, on tensors the import carries NCHW (after a
    CONV_2D) and on 2-D / 3-D ones: MIRROR_PAD (reflect and symmetric), REVERSE_V2, GREATER, LESS_EQUAL,
    EQUAL, NOT_EQUAL, LOGICAL_AND / OR / NOT, SELECT_V2, REDUCE_MIN, UNPACK, BATCH_MATMUL (constant
    right-hand side with adj_y, adj_x), BROADCAST_TO, GATHER_ND, SPACE_TO_BATCH_ND -> DEPTHWISE_CONV_2D ->
    BATCH_TO_SPACE_ND (a dilated convolution as older converters write it, imported as one Conv) and
    SPACE_TO_BATCH_ND -> ABS -> BATCH_TO_SPACE_ND with crops (the general form), ELU, RELU_0_TO_1, GELU
    (tanh approximation), LOG_SOFTMAX (4-D), L2_NORMALIZATION, NEG, ABS, EXP, LOG, RSQRT, SQRT,
    SQUARED_DIFFERENCE."""
    m = Model(seed=22)
    tr = Traced(m)
    x = tr.input("input", (1, 8, 8, 4), 1 / 32, 0)
    w = m.qweights("conv/weights", (8, 1, 1, 4), 0)
    b = m.bias("conv/bias", 8, 1 / 32, w)
    tr.plain(w, m.tensors[w]["data"][:, 0, 0, :] * np.asarray(m.tensors[w]["scale"])[:, None])
    tr.plain(b, m.tensors[b]["data"] * np.asarray(m.tensors[b]["scale"]))
    c = tr.op("CONV_2D", [x, w, b], _conv1x1, "conv", "Conv2DOptions",
              {"Padding": SAME, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": NONE,
               "DilationWFactor": 1, "DilationHFactor": 1})
    same = tr._same(c)

    def ints(name, values):
        return tr.plain(m.const(name, values, "int32"), np.asarray(values))

    reflect = ints("mirror_reflect/paddings", [[0, 0], [1, 1], [2, 2], [0, 0]])
    mp = tr.op("MIRROR_PAD", [c, reflect], lambda v, p: np.pad(v, p, mode="reflect"), "mirror_reflect",
               "MirrorPadOptions", {"Mode": tflite.MirrorPadMode.REFLECT}, q=same)
    symmetric = ints("mirror_symmetric/paddings", [[0, 0], [0, 0], [1, 2], [0, 1]])
    ms = tr.op("MIRROR_PAD", [c, symmetric], lambda v, p: np.pad(v, p, mode="symmetric"), "mirror_symmetric",
               "MirrorPadOptions", {"Mode": tflite.MirrorPadMode.SYMMETRIC}, q=same)
    rv = tr.op("REVERSE_V2", [c, ints("reverse/axes", [2])], lambda v, a: np.flip(v, 2), "reverse", q=same)

    def boolean(op, ins, fn, name):
        t = m.tensor(name, np.shape(fn(*[tr.val[i] for i in ins])), "bool")
        m.op(op, ins, [t])
        return tr.plain(t, fn(*[tr.val[i] for i in ins]))

    gt = boolean("GREATER", [c, rv], np.greater, "greater")
    thr = tr.const("threshold", [0.25])
    le = boolean("LESS_EQUAL", [c, thr], np.less_equal, "less_equal")
    eq = boolean("EQUAL", [c, rv], np.equal, "equal")
    ne = boolean("NOT_EQUAL", [c, thr], np.not_equal, "not_equal")
    both = boolean("LOGICAL_AND", [gt, le], np.logical_and, "logical_and")
    neither = boolean("LOGICAL_NOT", [both], np.logical_not, "logical_not")
    cond = boolean("LOGICAL_OR", [neither, eq], np.logical_or, "logical_or")
    sel = tr.op("SELECT_V2", [gt, c, rv], np.where, "select_v2", q=same)
    fill = m.const("select_fill", [np.clip(np.rint(0.5 / same[0]) + same[1], -128, 127)], "int8",
                   scale=same[0], zp=same[1])
    tr.plain(fill, np.asarray([0.5]))
    sel2 = tr.op("SELECT_V2", [cond, sel, fill], np.where, "select_v2_fill", q=same)
    sel3 = tr.op("SELECT_V2", [ne, sel2, c], np.where, "select_v2_ne", q=same)
    rmin = tr.op("REDUCE_MIN", [sel3, ints("reduce_min/axes", [1, 2])], lambda v, a: v.min(axis=(1, 2)),
                 "reduce_min", "ReducerOptions", {"KeepDims": False}, q=same)
    # A dilated 3x3 depthwise convolution, as SPACE_TO_BATCH_ND -> DEPTHWISE_CONV_2D -> BATCH_TO_SPACE_ND.
    stb = tr.op("SPACE_TO_BATCH_ND", [c, ints("dilated/block", [2, 2]), ints("dilated/paddings", [[2, 2], [2, 2]])],
                lambda v, bl, p: _space_to_batch(v, (2, 2), ((2, 2), (2, 2))), "dilated/space_to_batch", q=same)
    dw = m.qweights("dilated/weights", (1, 3, 3, 8), 3)
    db = m.bias("dilated/bias", 8, same[0], dw)
    tr.plain(dw, m.tensors[dw]["data"] * np.asarray(m.tensors[dw]["scale"]))
    tr.plain(db, m.tensors[db]["data"] * np.asarray(m.tensors[db]["scale"]))
    dconv = tr.op("DEPTHWISE_CONV_2D", [stb, dw, db], _depthwise_valid, "dilated/depthwise", "DepthwiseConv2DOptions",
                  {"Padding": VALID, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 1,
                   "FusedActivationFunction": NONE, "DilationWFactor": 1, "DilationHFactor": 1})
    bts = tr.op("BATCH_TO_SPACE_ND", [dconv, ints("dilated/block2", [2, 2]), ints("dilated/crops", [[0, 0], [0, 0]])],
                lambda v, bl, cr: _batch_to_space(v, (2, 2)), "dilated", q=tr._same(dconv))
    # Not a dilated convolution (ABS between them, crops): the general SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND.
    stb2 = tr.op("SPACE_TO_BATCH_ND", [c, ints("batched/block", [2, 2]), ints("batched/paddings", [[0, 0], [2, 0]])],
                 lambda v, bl, p: _space_to_batch(v, (2, 2), ((0, 0), (2, 0))), "batched/space_to_batch", q=same)
    babs = tr.op("ABS", [stb2], np.abs, "batched/abs")
    bts2 = tr.op("BATCH_TO_SPACE_ND", [babs, ints("batched/block2", [2, 2]), ints("batched/crops", [[1, 0], [0, 1]])],
                 lambda v, bl, cr: _batch_to_space(v, (2, 2))[:, 1:, :-1, :], "batched", q=tr._same(babs))
    lsm = tr.op("LOG_SOFTMAX", [bts], lambda v: v - v.max(-1, keepdims=True)
                - np.log(np.exp(v - v.max(-1, keepdims=True)).sum(-1, keepdims=True)), "log_softmax", q=(16 / 256, 127))
    # 3-D and 2-D tensors: the transformer side.
    seq = tr.reshape("tokens", c, [2, 32, 8])
    u0, u1 = (m.act(f"unpack_{k}", (32, 8), *tr._same(seq)) for k in range(2))
    m.op("UNPACK", [seq], [u0, u1], "UnpackOptions", {"Num": 2, "Axis": 0})
    tr.plain(u0, tr.val[seq][0])
    tr.plain(u1, tr.val[seq][1])
    wk = tr.const("matmul/weights", m.rng.normal(0, 0.5, (16, 8)))
    bm = tr.op("BATCH_MATMUL", [u0, wk], lambda a, bb: a @ bb.T, "matmul_const", "BatchMatMulOptions",
               {"AdjX": False, "AdjY": True})
    gram = tr.op("BATCH_MATMUL", [u1, u0], lambda a, bb: a.T @ bb, "matmul_adj_x", "BatchMatMulOptions",
                 {"AdjX": True, "AdjY": False})
    elu = tr.op("ELU", [bm], lambda v: np.where(v > 0, v, np.exp(v) - 1), "elu")
    ge = tr.op("GELU", [gram], lambda v: _gelu(v, True), "gelu_tanh", "GeluOptions", {"Approximate": True})
    l2 = tr.op("L2_NORMALIZATION", [ge], lambda v: v / np.sqrt((v * v).sum(-1, keepdims=True)), "l2_normalization",
               "L2NormOptions", {"FusedActivationFunction": NONE}, q=(1 / 128, 0))
    r01 = tr.op("RELU_0_TO_1", [l2], lambda v: np.clip(v, 0, 1), "relu_0_to_1")
    bt = tr.op("BROADCAST_TO", [rmin, ints("broadcast/shape", [4, 8])], lambda v, s: np.broadcast_to(v, (4, 8)),
               "broadcast_to", q=same)
    gnd = tr.op("GATHER_ND", [c, ints("gather_nd/indices", [[0, 1, 2], [0, 3, 4], [0, 7, 7]])],
                lambda v, i: v[0, [1, 3, 7], [2, 4, 7]], "gather_nd", q=same)
    ng = tr.op("NEG", [gnd], np.negative, "neg", q=(same[0], -same[1]))  # the converter mirrors the zero-point
    ab = tr.op("ABS", [ng], np.abs, "abs")
    ex = tr.op("EXP", [ab], np.exp, "exp")
    lg = tr.op("LOG", [ex], lambda v: np.log(np.maximum(v, 1e-2)), "log")
    rs = tr.op("RSQRT", [ex], lambda v: 1 / np.sqrt(np.maximum(v, 1e-2)), "rsqrt")
    sd = tr.op("SQUARED_DIFFERENCE", [lg, rs], lambda a, bb: (a - bb) ** 2, "squared_difference")
    sr = tr.op("SQRT", [ex], np.sqrt, "sqrt")
    m.inputs, m.outputs = [x], [mp, ms, lsm, elu, r01, bt, sd, sr, bts2]
    return m.build()


def float_ops() -> bytes:
    """Float32 operators (several have no int8 kernel in LiteRT): POW, SQRT, RSQRT, SQUARE, NEG, SIN, COS,
    FLOOR, CEIL, ROUND, SIGN, FLOOR_DIV, FLOOR_MOD, CUMSUM, ADD_N, CAST, SELECT (vector condition), LESS,
    GREATER_EQUAL, REDUCE_PROD, GELU (erf), BATCH_MATMUL, SQUARED_DIFFERENCE, EXP, LOG, and FILL, ZEROS_LIKE,
    RANGE folded into constants."""
    m = Model(seed=23)
    a = m.tensor("a", (4, 6), "float32")
    b = m.tensor("b", (4, 6), "float32")

    def t(name, shape=(4, 6), dtype="float32"):
        return m.tensor(name, shape, dtype)

    def un(op, x, name, shape=(4, 6), **kw):
        y = t(name, shape)
        m.op(op, [x], [y], **kw)
        return y

    def bi(op, x, z, name, shape=(4, 6), dtype="float32", **kw):
        y = t(name, shape, dtype)
        m.op(op, [x, z], [y], **kw)
        return y

    sq = un("SQUARE", a, "square")
    sqrt = un("SQRT", sq, "sqrt")
    rs = un("RSQRT", bi("ADD", sq, m.const("one", [1.0], "float32"), "square_plus_one",
                        options="AddOptions", fields={"FusedActivationFunction": NONE}), "rsqrt")
    pw = bi("POW", sqrt, m.const("exponent", [1.5], "float32"), "pow")
    neg = un("NEG", pw, "neg")
    trig = bi("ADD", un("SIN", a, "sin"), un("COS", b, "cos"), "sin_plus_cos", options="AddOptions",
              fields={"FusedActivationFunction": NONE})
    scaled = bi("MUL", a, m.const("three", [3.0], "float32"), "times_three", options="MulOptions",
                fields={"FusedActivationFunction": NONE})
    rounding = m.tensor("rounding", (4, 6), "float32")
    m.op("ADD_N", [un("FLOOR", scaled, "floor"), un("CEIL", scaled, "ceil"), un("ROUND", scaled, "round"),
                   un("SIGN", b, "sign")], [rounding])
    divisor = bi("ADD", un("ABS", b, "abs_b"), m.const("half", [0.5], "float32"), "divisor",
                 options="AddOptions", fields={"FusedActivationFunction": NONE})
    fdiv = bi("FLOOR_DIV", scaled, divisor, "floor_div")
    fmod = bi("FLOOR_MOD", a, divisor, "floor_mod")
    cs = t("cumsum")
    m.op("CUMSUM", [a, m.const("cumsum/axis", 1, "int32")], [cs], "CumsumOptions", {"Exclusive": True, "Reverse": True})
    as_int = t("cast_int32", dtype="int32")
    m.op("CAST", [scaled], [as_int], "CastOptions", {})
    back = t("cast_float")
    m.op("CAST", [as_int], [back], "CastOptions", {})
    row_mask = t("row_mask", (4,), "bool")
    m.op("GREATER_EQUAL", [m.const("row_index", [0.0, 1.0, 2.0, 3.0], "float32"),
                           m.const("row_threshold", [2.0], "float32")], [row_mask])
    picked = t("select_rows")
    m.op("SELECT", [row_mask, a, b], [picked])
    lt = t("less", dtype="bool")
    m.op("LESS", [a, b], [lt])
    smaller = t("select_less")
    m.op("SELECT_V2", [lt, a, b], [smaller])
    prod = t("reduce_prod", (4,))
    m.op("REDUCE_PROD", [divisor, m.const("reduce_prod/axes", [1], "int32")], [prod], "ReducerOptions",
         {"KeepDims": False})
    gelu = un("GELU", b, "gelu", options="GeluOptions", fields={"Approximate": False})
    bm = t("batch_matmul", (4, 4))
    m.op("BATCH_MATMUL", [gelu, a], [bm], "BatchMatMulOptions", {"AdjX": False, "AdjY": True})
    sd = bi("SQUARED_DIFFERENCE", un("EXP", a, "exp"), un("LOG", divisor, "log"), "squared_difference")
    # Shape arithmetic a converter leaves in: folded to constants by the import.
    dims = m.const("fill/dims", [4, 6], "int32")
    filled = t("fill")
    m.op("FILL", [dims, m.const("fill/value", 0.25, "float32")], [filled])
    zeros = t("zeros_like")
    m.op("ZEROS_LIKE", [filled], [zeros])
    rng = t("range", (6,))
    m.op("RANGE", [m.const("range/start", 0.0, "float32"), m.const("range/limit", 3.0, "float32"),
                   m.const("range/delta", 0.5, "float32")], [rng])
    offset = bi("ADD", bi("ADD", filled, zeros, "fill_plus_zeros", options="AddOptions",
                          fields={"FusedActivationFunction": NONE}), rng, "offset", options="AddOptions",
                fields={"FusedActivationFunction": NONE})
    shifted = bi("ADD", neg, offset, "shifted", options="AddOptions", fields={"FusedActivationFunction": NONE})
    m.inputs = [a, b]
    m.outputs = [rs, shifted, trig, rounding, fdiv, fmod, cs, back, picked, smaller, prod, bm, sd]
    return m.build()


def int8_text() -> bytes:
    """Token ids in: EMBEDDING_LOOKUP of an int8 table (int8 out) and of a per-row int8 table (float out,
    TFLite's dequantizing lookup), GATHER of position embeddings by an input, ADD, FULLY_CONNECTED and
    TOPK_V2 (int8 values, int32 indices)."""
    m = Model(seed=24)
    tr = Traced(m)
    ids = tr.plain(m.tensor("token_ids", (8,), "int32"), m.rng.integers(0, 50, 8))
    positions = tr.plain(m.tensor("positions", (8,), "int32"), np.arange(8))
    table = tr.const("embedding/table", m.rng.normal(0, 1, (50, 16)))
    emb = tr.op("EMBEDDING_LOOKUP", [ids, table], lambda i, t: t[i], "embedding", q=tr._same(table))
    pos_table = tr.const("position/table", m.rng.normal(0, 0.5, (12, 16)))
    pos = tr.op("GATHER", [pos_table, positions], lambda t, i: t[i], "position", "GatherOptions", {"Axis": 0},
                q=tr._same(pos_table))
    h = tr.op("ADD", [emb, pos], np.add, "embedded", "AddOptions", {"FusedActivationFunction": NONE})
    logits = tr.fc("classifier", h, 10)
    values = m.act("topk_values", (8, 3), *tr._same(logits))
    indices = m.tensor("topk_indices", (8, 3), "int32")
    m.op("TOPK_V2", [logits, m.const("topk/k", [3], "int32")], [values, indices])
    per_row = m.qweights("embedding/per_row_table", (50, 4), 0)
    dense = m.tensor("dense_embedding", (8, 4), "float32")
    m.op("EMBEDDING_LOOKUP", [ids, per_row], [dense])
    m.inputs, m.outputs = [ids, positions], [values, indices, dense]
    return m.build()


def vit_encoder(tokens: int, dim: int, layers: int, heads: int, mlp: int, seed: int = 0) -> bytes:
    """An int8 ViT encoder of ``layers`` pre-norm blocks on ``tokens`` x ``dim`` patch embeddings (seeded
    random weights, calibrated scales): not committed; ``scripts/tflite_vit_estimate.py`` estimates the
    published ViT sizes with it."""
    m = Model(seed=seed)
    tr = Traced(m)
    hd = dim // heads
    x = tr.input("tokens", (1, tokens, dim), 1 / 32, 0)
    for layer in range(layers):
        p = f"block{layer}/"
        ln1 = tr.layer_norm(p + "ln1", x, squared_difference=True)
        qh, kh, vh = (tr.transpose(p + f"{n}_heads", tr.reshape(p + f"{n}_split", tr.fc(p + n, ln1, dim),
                                                               [1, tokens, heads, hd]), [0, 2, 1, 3]) for n in "qkv")
        scores = tr.op("BATCH_MATMUL", [qh, kh], lambda a, b: a @ np.swapaxes(b, -1, -2), p + "scores",
                       "BatchMatMulOptions", {"AdjX": False, "AdjY": True})
        scaled = tr.op("MUL", [scores, tr.const(p + "scale", [0.1 / np.sqrt(hd)])], np.multiply, p + "scaled",
                       "MulOptions", {"FusedActivationFunction": NONE})
        probs = tr.op("SOFTMAX", [scaled], _softmax, p + "softmax", "SoftmaxOptions", {"Beta": 1.0}, q=(1 / 256, -128))
        ctx = tr.op("BATCH_MATMUL", [probs, vh], np.matmul, p + "context", "BatchMatMulOptions",
                    {"AdjX": False, "AdjY": False})
        merged = tr.reshape(p + "merge", tr.transpose(p + "context_tokens", ctx, [0, 2, 1, 3]), [1, tokens, dim])
        x = tr.op("ADD", [x, tr.fc(p + "proj", merged, dim)], np.add, p + "residual1", "AddOptions",
                  {"FusedActivationFunction": NONE})
        h = tr.fc(p + "fc1", tr.layer_norm(p + "ln2", x, squared_difference=True), mlp)
        g = tr.op("GELU", [h], _gelu, p + "gelu", "GeluOptions", {"Approximate": False})
        x = tr.op("ADD", [x, tr.fc(p + "fc2", g, dim)], np.add, p + "residual2", "AddOptions",
                  {"FusedActivationFunction": NONE})
    m.inputs, m.outputs = [0], [x]
    return m.build()


MODELS = {
    "movenet_like.tflite": movenet_like, "int8_cnn.tflite": int8_cnn, "int8_misc.tflite": int8_misc,
    "int8_more.tflite": int8_more, "int8_layout.tflite": int8_layout, "float_model.tflite": float_model,
    "uint8_model.tflite": uint8_model, "int8_transformer.tflite": int8_transformer,
    "int8_ops.tflite": int8_ops, "int8_text.tflite": int8_text, "float_ops.tflite": float_ops,
    "hybrid.tflite": hybrid,
    "custom_op.tflite": lambda: custom_op(False), "flex_op.tflite": lambda: custom_op(True),
    "float16.tflite": float16, "unsupported_op.tflite": unsupported_op,
}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else HERE
    for name, fn in MODELS.items():
        data = fn()
        (out / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
