"""Builders for the ``recurrent`` family (NAF016 unroll-lstm, NAF017 unroll-gru).

Deterministic (seeded), small, IR 8, static shapes, opset 17 unless a case asks for an older opset
(Split/Clip/Unsqueeze changed signature in opsets 11 and 13). ``qdq=True`` quantizes the float model
the ST way with onnxruntime (``tests.builders.common.quantize_st``); onnxruntime's QDQ quantizer leaves
LSTM/GRU in float between a DequantizeLinear and a QuantizeLinear, as in real exports.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .common import infer, quantize_st

SEED = 4016
IR_VERSION = 8


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, name: str, shape, std: float) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def node(self, op: str, inputs, outputs, name: str, **attrs) -> list[str]:
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))
        return list(outputs)

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, name: str) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))

    def reshape(self, x: str, shape, name: str, out: str | None = None) -> str:
        s = self.const(name + ".shape", np.asarray(shape, np.int64))
        return self.node("Reshape", [x, s], [out or name], name)[0]

    def model(self, opset: int, qdq: bool, seed: int) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "nafix_recurrent", self.inputs, self.outputs, initializer=self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="nafix-tests")
        m.ir_version = IR_VERSION
        m = infer(m)
        return infer(quantize_st(m, self.rng)) if qdq else m


def _recurrent(op: str, gates: int, seq: int, batch: int, input_size: int, hidden: int, direction: str,
               states: str, use: tuple, pre: bool, bias: bool, layout: int, qdq: bool, opset: int, seed: int,
               **attrs) -> onnx.ModelProto:
    g = _Net(seed)
    nd = 2 if direction == "bidirectional" else 1
    H, I, T, B = hidden, input_size, seq, batch
    xshape = [B, T, I] if layout else [T, B, I]
    sshape = [B, nd, H] if layout else [nd, B, H]
    x = g.input("x", xshape)
    if pre:  # a constant-weight MatMul + Relu in front (HW context in the QDQ model)
        x = g.node("MatMul", [x, g.weight("pre.weight", (I, I), 1.0 / np.sqrt(I))], ["pre_out"], "pre")[0]
        x = g.node("Relu", [x], ["pre_relu"], "pre_relu")[0]
    ins = [x, g.weight(f"{op.lower()}.W", (nd, gates * H, I), 0.4), g.weight(f"{op.lower()}.R", (nd, gates * H, H), 0.4)]
    ins.append(g.weight(f"{op.lower()}.B", (nd, 2 * gates * H), 0.3) if bias else "")
    while len(ins) < 5:
        ins.append("")
    state_names = ["h0", "c0"][: 2 if op == "LSTM" else 1]
    for s in state_names:
        if states == "inputs":
            ins.append(g.input(s, sshape))
        elif states == "const":
            ins.append(g.const(s, (g.rng.standard_normal(sshape) * 0.5).astype(np.float32)))
        elif states == "zeros":
            ins.append(g.const(s, np.zeros(sshape, np.float32)))
        else:
            ins.append("")
    if "P" in attrs:
        ins.append(g.weight("lstm.P", (nd, 3 * H), attrs.pop("P")))
    while ins and ins[-1] == "":
        ins.pop()
    outs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    outs = [o if o in use else "" for o in outs]
    while outs and outs[-1] == "":
        outs.pop()
    if layout:
        attrs["layout"] = 1
    g.node(op, ins, outs, op.lower(), hidden_size=H, direction=direction, **attrs)
    if "Y" in use:
        yshape = [B, T, nd * H] if layout else [T, B * nd * H]
        flat = g.reshape("Y", yshape if layout else [T, nd * B * H], "y_flat")
        g.node("MatMul", [flat, g.weight("head.weight", (nd * B * H if not layout else nd * H, 8), 0.3)], ["y"], "head")
        g.output("y")
    if "Y_h" in use:
        g.outputs.append(helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, None))
    if "Y_c" in use:
        g.outputs.append(helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, None))
    return g.model(opset, qdq, seed)


def lstm(seq: int = 8, batch: int = 1, input_size: int = 16, hidden: int = 32, direction: str = "forward",
         states: str = "none", use: tuple = ("Y",), pre: bool = True, bias: bool = True, layout: int = 0,
         qdq: bool = False, opset: int = 17, peephole: bool = False, clip: float | None = None,
         activations: list | None = None, input_forget: int = 0, seq_lens: str | None = None,
         seed: int = SEED) -> onnx.ModelProto:
    """x [T,B,I] (``layout`` 1: [B,T,I]) [-> MatMul + Relu] -> LSTM -> outputs.

    ``states``: "none" (no initial_h/initial_c), "inputs" (graph inputs ``h0``/``c0``, streaming
    state), "const" (non-zero constant states) or "zeros". ``use``: which LSTM outputs exist and are
    read: ``Y`` feeds a Reshape + MatMul head (graph output ``y``), ``Y_h``/``Y_c`` are graph outputs.
    ``peephole``, ``clip``, ``activations``, ``input_forget`` set the op's options; ``seq_lens``:
    "full" (constant, all = T) or "short" (constant, T - 1)."""
    attrs = {}
    if peephole:
        attrs["P"] = 0.3
    if clip is not None:
        attrs["clip"] = float(clip)
    if activations:
        attrs["activations"] = list(activations)
    if input_forget:
        attrs["input_forget"] = int(input_forget)
    return _recurrent_seq("LSTM", 4, seq, batch, input_size, hidden, direction, states, tuple(use), pre, bias,
                          layout, qdq, opset, seed, seq_lens, **attrs)


def _recurrent_seq(op, gates, seq, batch, input_size, hidden, direction, states, use, pre, bias, layout, qdq, opset,
                   seed, seq_lens, **attrs):
    if not seq_lens:
        return _recurrent(op, gates, seq, batch, input_size, hidden, direction, states, use, pre, bias, layout, qdq,
                          opset, seed, **attrs)
    n = seq if seq_lens == "full" else seq - 1
    # build without, then splice the constant sequence_lens in as input 4
    m = _recurrent(op, gates, seq, batch, input_size, hidden, direction, states, use, pre, bias, layout, False,
                   opset, seed, **attrs)
    m.graph.initializer.append(numpy_helper.from_array(np.full((batch,), n, np.int32), "seq_lens"))
    node = next(nd for nd in m.graph.node if nd.op_type == op)
    ins = list(node.input) + [""] * max(0, 5 - len(node.input))
    ins[4] = "seq_lens"
    del node.input[:]
    node.input.extend(ins)
    m = infer(m)
    return infer(quantize_st(m, np.random.default_rng(seed))) if qdq else m


def gru(seq: int = 8, batch: int = 1, input_size: int = 16, hidden: int = 32, direction: str = "forward",
        states: str = "none", use: tuple = ("Y",), pre: bool = True, bias: bool = True, layout: int = 0,
        qdq: bool = False, opset: int = 17, linear_before_reset: int = 0, clip: float | None = None,
        activations: list | None = None, seq_lens: str | None = None, seed: int = SEED + 1) -> onnx.ModelProto:
    """x [T,B,I] [-> MatMul + Relu] -> GRU -> outputs; options as :func:`lstm` (``states`` sets ``h0``)."""
    attrs = {"linear_before_reset": int(linear_before_reset)}
    if clip is not None:
        attrs["clip"] = float(clip)
    if activations:
        attrs["activations"] = list(activations)
    return _recurrent_seq("GRU", 3, seq, batch, input_size, hidden, direction, states, tuple(use), pre, bias, layout,
                          qdq, opset, seed, seq_lens, **attrs)


def streaming_lstm(input_size: int = 32, hidden: int = 64, out: int = 16, qdq: bool = False,
                   seed: int = SEED + 2) -> onnx.ModelProto:
    """One step of a streaming LSTM with its state as model I/O, like the forum denoiser (states
    1x256 int8 in and out): x [1, I] -> MatMul + Relu -> Reshape [1,1,I] -> LSTM(T=1, initial_h/_c
    from inputs ``h_in``/``c_in`` [1, H] reshaped to [1,1,H]) -> Y_h, Y_c reshaped to [1, H] as
    outputs ``h_out``/``c_out``; Y_h also feeds MatMul -> Sigmoid -> ``mask`` [1, out]."""
    g = _Net(seed)
    I, H = input_size, hidden
    x = g.input("x", [1, I])
    h_in = g.input("h_in", [1, H])
    c_in = g.input("c_in", [1, H])
    x = g.node("MatMul", [x, g.weight("pre.weight", (I, I), 1.0 / np.sqrt(I))], ["pre_out"], "pre")[0]
    x = g.node("Relu", [x], ["pre_relu"], "pre_relu")[0]
    x3 = g.reshape(x, [1, 1, I], "x_seq")
    h0 = g.reshape(h_in, [1, 1, H], "h0")
    c0 = g.reshape(c_in, [1, 1, H], "c0")
    ins = [x3, g.weight("lstm.W", (1, 4 * H, I), 0.3), g.weight("lstm.R", (1, 4 * H, H), 0.3),
           g.weight("lstm.B", (1, 8 * H), 0.2), "", h0, c0]
    g.node("LSTM", ins, ["", "lstm_h", "lstm_c"], "lstm", hidden_size=H)
    g.reshape("lstm_h", [1, H], "h_flat", "h_out")
    g.reshape("lstm_c", [1, H], "c_flat", "c_out")
    m_ = g.node("MatMul", ["h_out", g.weight("mask.weight", (H, out), 0.3)], ["mask_pre"], "mask_mm")[0]
    g.node("Sigmoid", [m_], ["mask"], "mask_sig")
    for o in ("mask", "h_out", "c_out"):
        g.output(o)
    return g.model(17, qdq, seed)


def no_recurrent(qdq: bool = False, seed: int = SEED + 3) -> onnx.ModelProto:
    """x [8,1,16] -> MatMul -> Tanh -> MatMul -> y: no LSTM/GRU (the rule must not fire)."""
    g = _Net(seed)
    x = g.input("x", [8, 1, 16])
    h = g.node("MatMul", [x, g.weight("a.weight", (16, 32), 0.25)], ["a"], "a")[0]
    h = g.node("Tanh", [h], ["t"], "t")[0]
    g.node("MatMul", [h, g.weight("b.weight", (32, 8), 0.2)], ["y"], "b")
    g.output("y")
    return g.model(17, qdq, seed)


def sample(name: str) -> onnx.ModelProto:
    """A committed sample model (``denoiser_257``, ``denoiser_257_float``)."""
    from .qdq import sample as _sample

    return _sample(name)
