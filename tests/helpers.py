"""Small ONNX model builders for the placement, estimate and CLI tests.

Every model is built with ``onnx.helper`` (IR version 8, opset 17), shape-inferred with
``strict_mode`` (so a builder mistake fails loudly here, not as a confusing placement) and kept tiny.

Two styles:

- :func:`float_model` - one op on float graph inputs, no quantization at all;
- :class:`QDQ` - the layout onnxruntime's QDQ quantizer writes: every activation is
  ``QuantizeLinear -> DequantizeLinear`` (int8 scale/zero-point, per tensor), weights are int8
  initializers read through a per-channel ``DequantizeLinear`` (axis 0 unless told otherwise),
  graph inputs and outputs are int8 by default (so no float-edge conversion shows up unless a
  test asks for it with ``float_io=True``).

:func:`place_node` runs the real placement (``fixer.api.analyze_model`` with the built-in profile)
and returns the :class:`NodePlacement` of one named node.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 8
OPSET = 17
INT8 = TensorProto.INT8
UINT8 = TensorProto.UINT8
FLOAT = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), *, opset: int = OPSET, infer: bool = True,
               name: str = "test") -> onnx.ModelProto:
    """A ModelProto with IR 8 / opset 17, shape-inferred strictly unless ``infer`` is False."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="nafix-tests")
    model.ir_version = IR_VERSION
    if infer:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return model


def float_model(op_type: str, input_shapes: Sequence[Sequence[int]], *, name: str = "op",
                attrs: dict | None = None, initializers: dict[str, np.ndarray] | None = None,
                extra_inputs: Sequence[str] = ()) -> onnx.ModelProto:
    """``op_type`` applied to float graph inputs ``x0, x1, ...`` (then ``extra_inputs``, names of
    ``initializers``), output ``y``. No Q/DQ anywhere."""
    inputs = [helper.make_tensor_value_info(f"x{i}", FLOAT, list(s)) for i, s in enumerate(input_shapes)]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    node = helper.make_node(op_type, [f"x{i}" for i in range(len(input_shapes))] + list(extra_inputs), ["y"],
                            name=name, **(attrs or {}))
    out = helper.make_tensor_value_info("y", FLOAT, None)
    return make_model([node], inputs, [out], inits)


class QDQ:
    """Build a QDQ-quantized graph node by node.

    Tensor names returned by :meth:`input`, :meth:`weight`, :meth:`qconst` and :meth:`op` are
    float tensors "in the int8 domain": an op output is re-quantized (Q -> DQ) automatically when a
    later op reads it, and :meth:`output` quantizes it into an int8 graph output.
    """

    def __init__(self, act_type: int = INT8, *, float_io: bool = False, scale: float = 0.05):
        self.act_type = act_type
        self.float_io = float_io
        self.scale = scale
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._raw: set[str] = set()  # op outputs not yet quantized
        self._requant: dict[str, str] = {}  # raw tensor -> its DQ'd copy
        self._q: dict[str, str] = {}  # raw tensor -> its Q output
        self._qparams_made = False

    # -- quantization parameters ---------------------------------------------------------------
    def _qparams(self) -> tuple[str, str]:
        if not self._qparams_made:
            zp_dtype = np.int8 if self.act_type == INT8 else np.uint8
            zp = 0 if self.act_type == INT8 else 128
            self.inits.append(numpy_helper.from_array(np.array(self.scale, np.float32), "act_scale"))
            self.inits.append(numpy_helper.from_array(np.array(zp, zp_dtype), "act_zp"))
            self._qparams_made = True
        return "act_scale", "act_zp"

    def _quantize(self, t: str) -> str:
        if t not in self._q:
            s, z = self._qparams()
            self.nodes.append(helper.make_node("QuantizeLinear", [t, s, z], [f"{t}_q"], name=f"{t}_QuantizeLinear"))
            self._q[t] = f"{t}_q"
        return self._q[t]

    def _requantized(self, t: str) -> str:
        if t not in self._raw:
            return t
        if t not in self._requant:
            q = self._quantize(t)
            s, z = self._qparams()
            self.nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [f"{t}_dq"], name=f"{t}_DequantizeLinear"))
            self._requant[t] = f"{t}_dq"
        return self._requant[t]

    # -- tensors -------------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int | str]) -> str:
        """A graph input, dequantized: int8 input -> DQ, or with ``float_io`` float input -> Q -> DQ."""
        s, z = self._qparams()
        if self.float_io:
            self.inputs.append(helper.make_tensor_value_info(name, FLOAT, list(shape)))
            self.nodes.append(helper.make_node("QuantizeLinear", [name, s, z], [f"{name}_q"], name=f"{name}_QuantizeLinear"))
            src = f"{name}_q"
        else:
            self.inputs.append(helper.make_tensor_value_info(name, self.act_type, list(shape)))
            src = name
        self.nodes.append(helper.make_node("DequantizeLinear", [src, s, z], [f"{name}_dq"], name=f"{name}_DequantizeLinear"))
        return f"{name}_dq"

    def float_input(self, name: str, shape: Sequence[int | str]) -> str:
        """A float graph input with no quantization (for float prologues)."""
        self.inputs.append(helper.make_tensor_value_info(name, FLOAT, list(shape)))
        self._raw.add(name)
        return name

    def weight(self, name: str, shape: Sequence[int], *, axis: int = 0, seed: int = 0) -> str:
        """An int8 initializer through a per-channel DequantizeLinear (symmetric, zero-point 0)."""
        rng = np.random.default_rng(seed)
        w = rng.integers(-127, 128, size=tuple(shape)).astype(np.int8)
        n = int(shape[axis])
        self.inits.append(numpy_helper.from_array(w, f"{name}_quantized"))
        self.inits.append(numpy_helper.from_array(np.full(n, 0.01, np.float32), f"{name}_scale"))
        self.inits.append(numpy_helper.from_array(np.zeros(n, np.int8), f"{name}_zero_point"))
        self.nodes.append(helper.make_node(
            "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"], [name],
            name=f"{name}_DequantizeLinear", axis=axis))
        return name

    def bias(self, name: str, n: int) -> str:
        """An int32 bias through a per-channel DequantizeLinear (as onnxruntime writes it)."""
        self.inits.append(numpy_helper.from_array(np.arange(n, dtype=np.int32), f"{name}_quantized"))
        self.inits.append(numpy_helper.from_array(np.full(n, 0.0005, np.float32), f"{name}_scale"))
        self.inits.append(numpy_helper.from_array(np.zeros(n, np.int32), f"{name}_zero_point"))
        self.nodes.append(helper.make_node(
            "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"], [name],
            name=f"{name}_DequantizeLinear", axis=0))
        return name

    def qconst(self, name: str, value: np.ndarray) -> str:
        """A per-tensor int8 constant through a DequantizeLinear."""
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int8), f"{name}_quantized"))
        s, z = self._qparams()
        self.nodes.append(helper.make_node("DequantizeLinear", [f"{name}_quantized", s, z], [name],
                                           name=f"{name}_DequantizeLinear"))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        """A plain initializer (float parameter, int64 shape argument, ...)."""
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    # -- ops -----------------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Iterable[str], *, name: str, outputs: int = 1, **attrs) -> str | list[str]:
        """Add ``op_type`` reading ``inputs`` (raw op outputs are re-quantized first); returns the
        raw output name(s) ``<name>_out[_k]``."""
        ins = [self._requantized(t) if t else "" for t in inputs]
        outs = [f"{name}_out" if outputs == 1 else f"{name}_out_{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, ins, outs, name=name, **attrs))
        self._raw.update(outs)
        return outs[0] if outputs == 1 else outs

    def raw_op(self, op_type: str, inputs: Iterable[str], *, name: str, **attrs) -> str:
        """Add ``op_type`` reading ``inputs`` exactly as given (no automatic re-quantization)."""
        out = f"{name}_out"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        self._raw.add(out)
        return out

    def output(self, t: str, name: str = "y") -> None:
        """Make ``t`` a graph output: its QuantizeLinear output (int8, called ``<t>_q``) or, with
        ``float_io``, Q -> DQ -> a float output called ``name``."""
        if t not in self._raw:
            raise ValueError(f"{t} is not an op output")
        q = self._quantize(t)
        s, z = self._qparams()
        if self.float_io:
            self.nodes.append(helper.make_node("DequantizeLinear", [q, s, z], [name], name=f"{name}_DequantizeLinear"))
            self.outputs.append(helper.make_tensor_value_info(name, FLOAT, None))
        else:
            self.outputs.append(helper.make_tensor_value_info(q, self.act_type, None))

    def float_output(self, t: str) -> None:
        """Make the raw float tensor ``t`` a graph output as is."""
        self.outputs.append(helper.make_tensor_value_info(t, FLOAT, None))

    def model(self, *, opset: int = OPSET) -> onnx.ModelProto:
        return make_model(self.nodes, self.inputs, self.outputs, self.inits, opset=opset)


def qdq_op(op_type: str, input_shapes: Sequence[Sequence[int]], *, name: str = "op", weights: dict | None = None,
           weight_axis: int = 0, act_type: int = INT8, float_io: bool = False, **attrs) -> onnx.ModelProto:
    """One quantized op: activations ``x0, x1, ...`` (int8 graph inputs -> DQ), then the named
    per-channel int8 ``weights`` (``{"w": shape}``, quantized along ``weight_axis``); the op's
    output is quantized into the graph output."""
    b = QDQ(act_type, float_io=float_io)
    ins = [b.input(f"x{i}", s) for i, s in enumerate(input_shapes)]
    for wname, shape in (weights or {}).items():
        ins.append(b.weight(wname, shape, axis=weight_axis))
    y = b.op(op_type, ins, name=name, **attrs)
    b.output(y)
    return b.model()


# ---------------------------------------------------------------------------------------------
# Running placement
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def profile(options: frozenset[str] = frozenset()):
    from fixer.npu.profile import load_profile

    return load_profile(options=options)


def analyze(model: onnx.ModelProto, *, options: Iterable[str] = (), prof=None):
    """``fixer.api.analyze_model`` with the built-in stm32n6 profile (plus stedgeai ``options``)."""
    from fixer.api import analyze_model

    return analyze_model(model, profile=prof or profile(frozenset(options)))


def place_node(model: onnx.ModelProto, name: str, *, options: Iterable[str] = (), prof=None):
    """The :class:`fixer.npu.placement.NodePlacement` of the node called ``name``."""
    a = analyze(model, options=options, prof=prof)
    by_name = a.placement.by_name
    if name not in by_name:
        raise KeyError(f"no node '{name}' in the placement; nodes: {sorted(by_name)}")
    return by_name[name]


def profile_with_limits(**limits):
    """The built-in profile with some limit values replaced (to prove sentences use live limits)."""
    base = profile()
    new = dict(base.limits)
    for k, v in limits.items():
        new[k] = replace(new[k], value=v)
    return replace(base, limits=new)


def reason(placement, constraint: str):
    """The failing reason (or note) of ``placement`` for ``constraint``; AssertionError if none."""
    for r in tuple(placement.reasons) + tuple(placement.notes):
        if r.constraint == constraint:
            return r
    raise AssertionError(
        f"{placement.name}: no reason for {constraint}; reasons: {[r.constraint for r in placement.reasons]}, "
        f"notes: {[r.constraint for r in placement.notes]}")


def sha256_tree(root) -> dict[str, str]:
    """sha256 of every file under ``root`` (to prove inputs are left byte-identical)."""
    import hashlib
    from pathlib import Path

    root = Path(root)
    if root.is_file():
        return {root.name: hashlib.sha256(root.read_bytes()).hexdigest()}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def save(model: onnx.ModelProto, path) -> None:
    from pathlib import Path

    Path(path).write_bytes(model.SerializeToString())


#: keys a rule-case file may set for all its cases (a case may override them): the stedgeai options and
#: core version the placement model assumes, and which of the profile's lowerings to keep (default: all)
CASE_PROFILE_KEYS = ("stedgeai_options", "core", "profile_lowerings")


def case_with_file_defaults(data: dict, case: dict) -> dict:
    """A rule case with its case file's profile keys filled in."""
    return {**{k: data[k] for k in CASE_PROFILE_KEYS if k in data}, **case}


def case_profile(case: dict):
    """The built-in profile with a rule case's stedgeai options, core version and lowerings."""
    from dataclasses import replace

    from fixer.npu.profile import load_profile

    prof = load_profile(options=frozenset(case.get("stedgeai_options") or ()), core=case.get("core"))
    if "profile_lowerings" in case:
        keep = set(case["profile_lowerings"] or ())
        prof = replace(prof, lowerings={k: v for k, v in prof.lowerings.items() if k in keep})
    return prof


def run_cli(args, capsys) -> tuple[int, str, str]:
    """Run ``nafix ARGS`` in-process (pytest's ``capsys`` captures the output); return
    (exit code, stdout, stderr)."""
    from fixer.cli import main

    capsys.readouterr()
    code = 0
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def headless_chromium(url: str, tmp_path, *args: str):
    """Run headless Chromium (or Chrome) on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=``...)
    and return the finished process; the test skips where no browser is installed or it cannot start."""
    import shutil
    import subprocess

    import pytest

    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        pytest.skip("no Chromium/Chrome installed for the headless-browser check")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args, url]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the headless browser did not finish within 90 s")
    if proc.returncode != 0 and not proc.stdout:
        pytest.skip(f"the browser could not start here: {proc.stderr.strip()[-300:]}")
    return proc
