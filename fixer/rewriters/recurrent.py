"""Recurrent rewriters: unroll an ONNX LSTM (or GRU) into one cell per time step built from NPU ops.

LSTM and GRU are not in the Neural-ART operator set (NPU_FACTS.md#operators): they run on the Cortex-M55,
and in a QDQ model with a DequantizeLinear / QuantizeLinear pair of SW conversions around them. A
recurrent layer with a static, short sequence is a fixed sequence of matrix products and element-wise
ops, all of which the NPU runs: the rewrite writes that sequence out.

For each direction the input projection of every time step is one MatMul with the constant ``W^T``
(``[I, G*H]``) plus the pre-summed bias ``Wb + Rb``, split into one ``[1, B, G*H]`` slice per step.
Each step adds the recurrent product ``h_{t-1} R^T`` (skipped at the first step when there is no
initial state: it is zero), splits the gates, applies the gate activations and combines them with
Mul/Add. Hidden states stay ``[1, B, H]`` throughout (``[num_directions, B, H]`` for one direction),
so no tensor exceeds rank 4: ``Y`` is the Concat of the per-step ``h_t`` reshaped to
``[T, num_directions, B, H]``. Only the outputs that are read (or are graph outputs) are built, and
they keep their names.

In a QDQ model the recurrent op is a float island (onnxruntime's QDQ quantizer leaves LSTM/GRU in
float) and so are the unrolled cells: they reach the NPU once the model is re-quantized
(``nafix --quantize``), which calibrates the new tensors.
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..graph import QDQ_OPS, Editor, attr, node_label, read_weight
from . import Match, NearMiss, RewriteResult, rewriter

LSTM_ACTIVATIONS = ("sigmoid", "tanh", "tanh")
GRU_ACTIVATIONS = ("sigmoid", "tanh")


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"




def _input(node: ir.Node, i: int) -> ir.Tensor | None:
    if i >= len(node.inputs):
        return None
    t = node.inputs[i]
    return t if t.name else None


class _Ops:
    """Opset-aware node builders on top of the Editor (Split and Clip changed signature in opsets
    11/13); every new tensor gets its dtype and shape."""

    def __init__(self, ed: Editor, opset: int, dtype):
        self.ed = ed
        self.opset = opset
        self.dtype = np.dtype(dtype)

    def _node(self, op, inputs, shape, attrs=None, outputs=None):
        n = self.ed.node(op, inputs, outputs, attrs, dtype=self.dtype, shape=list(shape) if shape is not None else None)
        return n.outputs

    def const(self, values, base=None) -> ir.Constant:
        return self.ed.const(np.asarray(values, dtype=self.dtype), base)

    def op(self, op, inputs, shape, **attrs) -> ir.Tensor:
        return self._node(op, inputs, shape, attrs)[0]

    def matmul(self, x, w: np.ndarray, shape) -> ir.Tensor:
        return self.op("MatMul", [x, self.const(w)], shape)

    def split(self, x, sizes: list[int], axis: int, shape) -> list[ir.Tensor]:
        if len(sizes) == 1:
            return [x]
        outs = []
        for s in sizes:
            sh = list(shape)
            sh[axis] = s
            outs.append(self.ed.var(dtype=self.dtype, shape=sh))
        if self.opset >= 13:
            self._node("Split", [x, self.ed.const(np.asarray(sizes, dtype=np.int64))], None, {"axis": axis}, outs)
        else:
            self._node("Split", [x], None, {"axis": axis, "split": list(sizes)}, outs)
        return outs

    def concat(self, xs, axis: int, shape) -> ir.Tensor:
        if len(xs) == 1:
            return xs[0]
        return self.op("Concat", list(xs), shape, axis=axis)

    def reshape(self, x, shape) -> ir.Tensor:
        if list(x.shape or []) == list(shape):
            return x
        return self.op("Reshape", [x, self.ed.const(np.asarray(shape, dtype=np.int64))], shape)

    def clip(self, x, limit: float, shape) -> ir.Tensor:
        if self.opset >= 11:
            lo = ir.Constant(self.ed.name(), np.asarray(-limit, dtype=self.dtype))
            hi = ir.Constant(self.ed.name(), np.asarray(limit, dtype=self.dtype))
            return self.op("Clip", [x, lo, hi], shape)
        return self.op("Clip", [x], shape, min=float(-limit), max=float(limit))

    def add_const(self, x, values: np.ndarray, shape) -> ir.Tensor:
        if not np.any(values):
            return x
        return self.op("Add", [x, self.const(values)], shape)


# ------------------------------------------------------------------------------------------------
# shared checks
# ------------------------------------------------------------------------------------------------


class _Recurrent:
    """What LSTM and GRU share: geometry, weights, initial states, outputs."""

    def __init__(self, match: Match, ed: Editor, gates: int, default_acts: tuple[str, ...], states: tuple[int, ...]):
        """Check every precondition (raising NearMiss before anything is built)."""
        node, view = match.node, match.view
        self.node, self.view, self.match = node, view, match
        self.label = _q(node)
        x = node.inputs[0]
        self.x = x
        info = view.info(x)
        if int(attr(node, "layout", 0) or 0):
            raise NearMiss(f"{self.label} uses layout=1 (batch first); onnxruntime does not run batch-first "
                           f"recurrent ops, so nafix could not verify an unrolled version (only layout=0 is "
                           f"unrolled).")
        if info.dtype is None or info.dtype != np.float32:
            raise NearMiss(f"{self.label} computes in {info.dtype}; only float32 {node.op} is unrolled.")
        if info.shape is None or len(info.shape) != 3 or not info.static:
            raise NearMiss(f"{self.label} reads input '{x.name}' of shape "
                           f"{list(info.shape) if info.shape is not None else 'unknown'}; unrolling needs a static "
                           f"[seq_length, batch, input_size] shape (pin dynamic dimensions with --input-shape).")
        t, b, i = info.shape
        self.T, self.B, self.I = int(t), int(b), int(i)
        if min(self.T, self.B, self.I) < 1:
            raise NearMiss(f"{self.label} reads an empty input of shape {list(info.shape)}.")
        max_steps = int(match.params.get("max_steps", 64))
        if self.T > max_steps:
            raise NearMiss(f"{self.label} runs {self.T} time steps; unrolling is limited to {max_steps} "
                           f"(max_steps): the graph would grow by one cell per step.")
        direction = attr(node, "direction", "forward") or "forward"
        if direction not in ("forward", "reverse", "bidirectional"):
            raise NearMiss(f"{self.label} has unknown direction '{direction}'.")
        self.direction = direction
        self.nd = 2 if direction == "bidirectional" else 1
        self.W = self._weight(1, "input weights W")
        self.R = self._weight(2, "recurrence weights R")
        G = gates
        if self.W.ndim != 3 or self.W.shape[0] != self.nd or self.W.shape[1] % G:
            raise NearMiss(f"{self.label} has input weights of shape {list(self.W.shape)}, not "
                           f"[{self.nd}, {G}*hidden, input].")
        H = int(attr(node, "hidden_size", 0) or self.W.shape[1] // G)
        self.H = H
        if self.W.shape != (self.nd, G * H, self.I) or self.R.shape != (self.nd, G * H, H):
            raise NearMiss(f"{self.label} has weights W {list(self.W.shape)} and R {list(self.R.shape)} that do "
                           f"not match hidden size {H} and input size {self.I}.")
        bt = _input(node, 3)
        if bt is None:
            self.Bias = np.zeros((self.nd, 2 * G * H), np.float32)
        else:
            self.Bias = self._weight(3, "bias B")
            if self.Bias.shape != (self.nd, 2 * G * H):
                raise NearMiss(f"{self.label} has a bias of shape {list(self.Bias.shape)}, not [{self.nd}, {2 * G * H}].")
        sl = _input(node, 4)
        if sl is not None:
            v = view.const_value(sl)
            if v is None or not np.all(np.asarray(v) == self.T):
                raise NearMiss(f"{self.label} has sequence_lens '{sl.name}'"
                               f"{'' if v is None else ' ' + str(np.asarray(v).tolist())}; unrolling needs every "
                               f"sequence to run all {self.T} steps (sequence_lens absent, or constant and equal "
                               f"to the sequence length).")
        acts = attr(node, "activations", None)
        if acts:
            want = list(default_acts) * self.nd
            if [a.lower() for a in acts] != want:
                raise NearMiss(f"{self.label} uses activations {list(acts)}; only the default "
                               f"{[a.capitalize() for a in default_acts]} are unrolled.")
        if attr(node, "activation_alpha", None) or attr(node, "activation_beta", None):
            raise NearMiss(f"{self.label} sets activation_alpha/activation_beta; only the default activations "
                           f"are unrolled.")
        clip = attr(node, "clip", None)
        self.clip = float(clip) if clip is not None else None
        if self.clip is not None and self.clip <= 0:
            raise NearMiss(f"{self.label} has clip={self.clip}; the threshold must be positive.")
        for idx in states:
            t = _input(node, idx)
            if t is None:
                continue
            info = view.info(t)
            want = [self.nd, self.B, self.H]
            v = view.const_value(t)
            shape = list(v.shape) if v is not None else (list(info.shape) if info.shape is not None else None)
            if shape is not None and shape != want:
                raise NearMiss(f"{self.label} has initial state '{t.name}' of shape {shape}, not {want}.")
        self.ops = _Ops(ed, match.view.opset or 17, np.float32)

    def _weight(self, idx: int, what: str) -> np.ndarray:
        t = _input(self.node, idx)
        if t is None:
            raise NearMiss(f"{self.label} has no {what}.")
        w = read_weight(self.view, t)
        if w is None:
            raise NearMiss(f"{self.label} reads its {what} '{t.name}' from a computation; unrolling needs "
                           f"constant weights (directly or through one DequantizeLinear).")
        return w.dequantized().astype(np.float32)

    def state(self, idx: int) -> list[ir.Tensor | np.ndarray | None]:
        """Per direction: the initial state as a [1, B, H] tensor, a constant array, or None (zero)."""
        t = _input(self.node, idx)
        if t is None:
            return [None] * self.nd
        v = self.view.const_value(t)
        if v is not None:
            v = np.asarray(v, np.float32)
            return [None if not np.any(v[d]) else v[d:d + 1] for d in range(self.nd)]
        if self.nd == 1:
            return [t]
        return self.ops.split(t, [1, 1], 0, [self.nd, self.B, self.H])

    def wanted(self) -> list[ir.Tensor | None]:
        """Y, Y_h, Y_c (GRU: Y, Y_h): the output tensors that are read or are graph outputs."""
        out = []
        for t in self.node.outputs:
            use = bool(t.name) and (len(t.outputs) > 0 or self.view.is_graph_output(t))
            out.append(t if use else None)
        return out

    def sequence(self) -> ir.Tensor:
        """X, [T, B, I]."""
        return self.x

    def input_projection(self, x: ir.Tensor, d: int, gates: int, bias: np.ndarray) -> list[ir.Tensor]:
        """x [T, B, I] -> T slices [1, B, gates*H] of x W_d^T + bias."""
        GH = gates * self.H
        o = self.ops
        xw = o.matmul(x, np.ascontiguousarray(self.W[d].T), [self.T, self.B, GH])
        xw = o.add_const(xw, bias, [self.T, self.B, GH])
        return o.split(xw, [1] * self.T, 0, [self.T, self.B, GH])

    def finish(self, ed: Editor, hs: list[list[ir.Tensor]], finals: list[list[ir.Tensor]]) -> list[str]:
        """Build Y from the per-direction hidden states (in time order) and the final states
        (Y_h, Y_c) from ``finals[k][d]``; rewire the readers of the original outputs. Returns the
        names of the outputs built."""
        o = self.ops
        T, B, H, nd = self.T, self.B, self.H, self.nd
        wanted = self.wanted()
        built = []
        news: list[tuple[ir.Tensor, ir.Tensor]] = []
        if wanted[0] is not None:
            per_dir = [o.reshape(o.concat(hs[d], 0, [T, B, H]), [T, 1, B, H]) for d in range(nd)]
            y = o.concat(per_dir, 1, [T, nd, B, H])
            news.append((wanted[0], y))
            built.append("Y")
        for k, name in ((1, "Y_h"), (2, "Y_c")):
            if k >= len(wanted) or wanted[k] is None:
                continue
            v = o.concat(finals[k - 1], 0, [nd, B, H])
            news.append((wanted[k], v))
            built.append(name)
        for old, new in news:
            if new is old:
                continue
            ed.replace_uses(old, new)
        ed.remove(self.node)
        return built

    def quantized_model(self) -> bool:
        return any(p.op_type in QDQ_OPS for p in self.match.placement.nodes)

    def detail(self, ed: Editor, built: list[str]) -> str:
        dirs = {"forward": "forward", "reverse": "reverse", "bidirectional": "both directions"}[self.direction]
        cells = self.T * self.nd
        ops = sorted({n.op for n in ed.created})
        s = (f"unrolled {self.label} ({dirs}, {self.T} step{'s' if self.T != 1 else ''}, hidden {self.H}) into "
             f"{cells} {self.node.op} cell{'s' if cells != 1 else ''}: {len(ed.created)} nodes of {'/'.join(ops)}, "
             f"building {', '.join(built) if built else 'no output (none is read)'}")
        if self.quantized_model():
            s += ("; the cells are float like the original op: re-quantize the model (nafix --quantize) "
                  "for them to run on the NPU")
        return s


# ------------------------------------------------------------------------------------------------
# LSTM
# ------------------------------------------------------------------------------------------------


@rewriter("unroll_lstm", max_steps=64)
def unroll_lstm(match: Match, ed: Editor) -> RewriteResult:
    """Replaces an LSTM with a static sequence length of at most ``max_steps`` by one cell per time
    step (and direction): x W^T for all steps in one MatMul with the bias Wb + Rb pre-summed, then per
    step h R^T (MatMul), Add, Split into the gates (ONNX order i, o, f, c), Sigmoid on i/o/f, Tanh on
    the candidate, c = f*c + i*g and h = o*Tanh(c) with Mul/Add (peepholes as Mul/Add, clip as Clip).
    Initial states come from the op's inputs (zero when absent). Y is the Concat of the h_t reshaped
    to [T, directions, B, H] (rank 4); Y, Y_h and Y_c are built only when read and keep their names."""
    node = match.node
    rec = _Recurrent(match, ed, 4, LSTM_ACTIVATIONS, (5, 6))
    if int(attr(node, "input_forget", 0) or 0):
        raise NearMiss(f"{rec.label} couples its input and forget gates (input_forget=1); only input_forget=0 "
                       f"is unrolled.")
    pt = _input(node, 7)
    P = None
    if pt is not None:
        P = rec._weight(7, "peephole weights P")
        if P.shape != (rec.nd, 3 * rec.H):
            raise NearMiss(f"{rec.label} has peephole weights of shape {list(P.shape)}, not [{rec.nd}, {3 * rec.H}].")
        if not np.any(P):
            P = None
    o = rec.ops
    T, B, H = rec.T, rec.B, rec.H
    h0 = rec.state(5)
    c0 = rec.state(6)
    x = rec.sequence()
    st = [1, B, H]
    hs, hT, cT = [], [], []
    for d in range(rec.nd):
        reverse = rec.direction == "reverse" or d == 1
        bias = rec.Bias[d, :4 * H] + rec.Bias[d, 4 * H:]
        xs = rec.input_projection(x, d, 4, bias)
        Rt = np.ascontiguousarray(rec.R[d].T)
        h = h0[d] if not isinstance(h0[d], np.ndarray) else o.const(h0[d])
        c = c0[d] if not isinstance(c0[d], np.ndarray) else o.const(c0[d])
        out = [None] * T
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            g = xs[t]
            if h is not None:
                g = o.op("Add", [g, o.matmul(h, Rt, [1, B, 4 * H])], [1, B, 4 * H])
            if P is None:
                if rec.clip is not None:
                    g = o.clip(g, rec.clip, [1, B, 4 * H])
                ifo, cand = o.split(g, [3 * H, H], 2, [1, B, 4 * H])
                ifo = o.op("Sigmoid", [ifo], [1, B, 3 * H])
                cand = o.op("Tanh", [cand], st)
                i, og, f = o.split(ifo, [H, H, H], 2, [1, B, 3 * H])
            else:
                pi, po, pf = P[d, :H], P[d, H:2 * H], P[d, 2 * H:]
                i, og_pre, f, cand = o.split(g, [H, H, H, H], 2, [1, B, 4 * H])
                if c is not None:
                    if np.any(pi):
                        i = o.op("Add", [i, o.op("Mul", [c, o.const(pi)], st)], st)
                    if np.any(pf):
                        f = o.op("Add", [f, o.op("Mul", [c, o.const(pf)], st)], st)
                if rec.clip is not None:
                    i, f, cand = (o.clip(v, rec.clip, st) for v in (i, f, cand))
                i = o.op("Sigmoid", [i], st)
                f = o.op("Sigmoid", [f], st)
                cand = o.op("Tanh", [cand], st)
            c_new = o.op("Mul", [i, cand], st)
            if c is not None:
                c_new = o.op("Add", [o.op("Mul", [f, c], st), c_new], st)
            if P is not None:
                if np.any(po):
                    og_pre = o.op("Add", [og_pre, o.op("Mul", [c_new, o.const(po)], st)], st)
                if rec.clip is not None:
                    og_pre = o.clip(og_pre, rec.clip, st)
                og = o.op("Sigmoid", [og_pre], st)
            h = o.op("Mul", [og, o.op("Tanh", [c_new], st)], st)
            c = c_new
            out[t] = h
        hs.append(out)
        hT.append(h)
        cT.append(c)
    built = rec.finish(ed, hs, [hT, cT])
    return RewriteResult(detail=rec.detail(ed, built))


# ------------------------------------------------------------------------------------------------
# GRU
# ------------------------------------------------------------------------------------------------


@rewriter("unroll_gru", max_steps=64)
def unroll_gru(match: Match, ed: Editor) -> RewriteResult:
    """Replaces a GRU with a static sequence length of at most ``max_steps`` by one cell per time step
    (and direction): x W^T for all steps in one MatMul with the biases pre-summed where the equations
    allow, then per step the recurrent MatMul(s), Add, Split into the gates (ONNX order z, r, h),
    Sigmoid on z/r, Tanh on the candidate (with linear_before_reset 0 or 1) and
    h = h~ + z*(h_prev - h~) with Sub/Mul/Add (no Sub from a constant, which runs in SW). Initial
    state from the op's input (zero when absent); Y ([T, directions, B, H], rank 4) and Y_h are built
    only when read and keep their names."""
    node = match.node
    rec = _Recurrent(match, ed, 3, GRU_ACTIVATIONS, (5,))
    o = rec.ops
    lbr = int(attr(node, "linear_before_reset", 0) or 0)
    T, B, H = rec.T, rec.B, rec.H
    h0 = rec.state(5)
    x = rec.sequence()
    st = [1, B, H]
    hs, hT = [], []
    for d in range(rec.nd):
        reverse = rec.direction == "reverse" or d == 1
        wb, rb = rec.Bias[d, :3 * H], rec.Bias[d, 3 * H:]
        # z and r take Wb + Rb; the candidate takes Wbh, plus Rbh outside the reset product when
        # linear_before_reset is 0 (inside it when 1)
        bias = wb + np.concatenate([rb[:2 * H], np.zeros(H, np.float32) if lbr else rb[2 * H:]])
        rbh = rb[2 * H:]
        xs = rec.input_projection(x, d, 3, bias)
        R = rec.R[d]
        R_zr_t = np.ascontiguousarray(R[:2 * H].T)
        R_h_t = np.ascontiguousarray(R[2 * H:].T)
        R_t = np.ascontiguousarray(R.T)
        h = h0[d] if not isinstance(h0[d], np.ndarray) else o.const(h0[d])
        out = [None] * T
        for t in (range(T - 1, -1, -1) if reverse else range(T)):
            x_zr, x_h = o.split(xs[t], [2 * H, H], 2, [1, B, 3 * H])
            if h is None:
                zr_pre = x_zr
                hr_h = None  # h_{t-1} R_h^T is zero
            elif lbr:
                hr = o.matmul(h, R_t, [1, B, 3 * H])
                hr_zr, hr_h = o.split(hr, [2 * H, H], 2, [1, B, 3 * H])
                zr_pre = o.op("Add", [x_zr, hr_zr], [1, B, 2 * H])
            else:
                zr_pre = o.op("Add", [x_zr, o.matmul(h, R_zr_t, [1, B, 2 * H])], [1, B, 2 * H])
            if rec.clip is not None:
                zr_pre = o.clip(zr_pre, rec.clip, [1, B, 2 * H])
            zr = o.op("Sigmoid", [zr_pre], [1, B, 2 * H])
            z, r = o.split(zr, [H, H], 2, [1, B, 2 * H])
            if lbr:
                # r * (h R_h^T + Rbh)
                if hr_h is None:
                    rec_term = o.op("Mul", [r, o.const(rbh)], st) if np.any(rbh) else None
                else:
                    rec_term = o.op("Mul", [r, o.add_const(hr_h, rbh, st)], st)
            else:
                # (r * h) R_h^T  (Rbh already in the input projection)
                rec_term = None if h is None else o.matmul(o.op("Mul", [r, h], st), R_h_t, st)
            cand_pre = x_h if rec_term is None else o.op("Add", [x_h, rec_term], st)
            if rec.clip is not None:
                cand_pre = o.clip(cand_pre, rec.clip, st)
            cand = o.op("Tanh", [cand_pre], st)
            # h = (1 - z) * cand + z * h_prev = cand + z * (h_prev - cand)
            if h is None:
                h = o.op("Sub", [cand, o.op("Mul", [z, cand], st)], st)
            else:
                h = o.op("Add", [cand, o.op("Mul", [z, o.op("Sub", [h, cand], st)], st)], st)
            out[t] = h
        hs.append(out)
        hT.append(h)
    built = rec.finish(ed, hs, [hT])
    return RewriteResult(detail=rec.detail(ed, built))
