"""Estimated inference time: milliseconds per inference from the epochs, the graph and the memory estimate.

Everything here is an *estimate* of nafix's own cost model, never a measurement. Per epoch:

* HW epoch: ``max(compute, memory) + hw_epoch_overhead``, where ``compute`` is the epoch's MACs against
  the NPU's MAC rate (dense and depthwise convolutions apart, element-wise work at its own rate) and
  ``memory`` the bytes the epoch moves per memory pool against that pool's bandwidth: the pool's
  ``byteWidth / freqRatio`` bytes per NPU cycle (what the compiler's own cost model reads from the
  .mpool), times an efficiency per kind of pool (on-chip RAM, external RAM, flash) fitted on published
  times. Activations are read from the on-chip pools, or in the share of the peak that the memory
  estimate spills, from external RAM; weights are read from the pools the memory estimate puts them in
  (flash by default).
* SW epoch (Cortex-M55): ``sw_epoch_overhead + elements x cycles per element`` of the op's kind
  (conversion, data movement, element-wise, transcendental, Resize, MAC-based), float or int8 kernel,
  at the MCU clock.
* hybrid epoch: the SW part as above with the int8 kernel, plus ``hybrid_epoch_overhead`` for the NPU
  part.
* plus one ``inference_overhead`` per inference.

The parameters and the clocks are data (the target profile's ``latency`` section, each with its
source); :func:`fit` (``scripts/fit_latency.py``) refits the fitted ones on published times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import ir
from ..errors import ProfileError
from ..graph import GraphView
from .placement import HW

HYBRID = "hybrid"

#: SW op kinds (cycles per element are per kind, int8 or float kernel)
SW_KINDS = {
    "conversion": frozenset({"QuantizeLinear", "DequantizeLinear", "Cast"}),
    "movement": frozenset({"Transpose", "DepthToSpace", "SpaceToDepth", "Concat", "Slice", "Split", "Gather",
                           "Pad", "Reshape", "Tile", "Expand", "Identity", "Flatten", "Squeeze", "Unsqueeze",
                           "GatherElements", "ScatterND", "Where"}),
    "transcendental": frozenset({"Softmax", "LogSoftmax", "Exp", "Log", "Sigmoid", "Tanh", "Gelu", "Softplus",
                                 "Erf", "HardSigmoid", "Sqrt", "Reciprocal", "Pow", "LayerNormalization",
                                 "InstanceNormalization", "Div", "GRU", "LSTM", "RNN"}),
    "resize": frozenset({"Resize", "Upsample"}),
    "macs": frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul", "ConvInteger",
                       "MatMulInteger", "Einsum"}),
}
_MAC_OPS = SW_KINDS["macs"]


def sw_kind(op: str) -> str:
    """The cost kind of a SW/hybrid epoch's op (``Op(float)`` as the reports name float kernels)."""
    kind = _KIND_OF.get(op)
    if kind is None:
        base = op.split("(", 1)[0].strip()
        kind = next((k for k, ops in SW_KINDS.items() if base in ops), "elementwise")
        _KIND_OF[op] = kind
    return kind


_KIND_OF: dict[str, str] = {}


@dataclass(frozen=True)
class Param:
    name: str
    value: float
    tag: str
    source: str
    fitted: bool = False


@dataclass(frozen=True)
class LatencyModel:
    """The ``latency`` section of a target profile, validated."""

    params: Mapping[str, Param]
    sw_cycles: Mapping[str, Mapping[str, float]]  # kind -> {"int8": c, "float": c}
    sw_tag: str
    sw_source: str
    npu_mhz: float
    mcu_mhz: float

    def v(self, name: str) -> float:
        return self.params[name].value

    def with_clocks(self, npu_mhz: float | None = None, mcu_mhz: float | None = None) -> "LatencyModel":
        from dataclasses import replace

        return replace(self, npu_mhz=float(npu_mhz or self.npu_mhz), mcu_mhz=float(mcu_mhz or self.mcu_mhz))

    def with_values(self, values: Mapping[str, float]) -> "LatencyModel":
        from dataclasses import replace

        params = dict(self.params)
        for k, val in values.items():
            params[k] = replace(params[k], value=float(val))
        return replace(self, params=params)


#: parameters every latency section must give (a number, a tag and a source each)
REQUIRED = ("npu_mhz", "mcu_mhz", "macs_per_cycle", "dw_macs_per_cycle", "eltwise_per_cycle",
            "onchip_bw_efficiency", "external_bw_efficiency", "flash_bw_efficiency",
            "hw_epoch_overhead_us", "sw_epoch_overhead_us", "hybrid_epoch_overhead_us", "inference_overhead_us",
            "default_byte_width", "default_freq_ratio_external")
_TAGS = ("DOC", "OBS", "3P", "INF", "FIT")

#: parsed latency sections, by id of the profile's section (the section is kept with it, so the id stays its own)
_MODELS: dict[int, tuple[Any, LatencyModel]] = {}


def latency_model(profile) -> LatencyModel | None:
    """The profile's latency model (None when the profile has no ``latency`` section)."""
    data = getattr(profile, "latency", None)
    if not data:
        return None
    hit = _MODELS.get(id(data))
    if hit is not None and hit[0] is data:
        return hit[1]
    model = parse_latency(data, profile.path)
    _MODELS[id(data)] = (data, model)
    return model


def parse_latency(data: Any, path: str) -> LatencyModel:
    if not isinstance(data, Mapping):
        raise ProfileError(f"{path}: 'latency' must be a mapping of parameters (value, tag, source).")
    params: dict[str, Param] = {}
    for key in REQUIRED:
        entry = data.get(key)
        where = f"latency.{key}"
        if not isinstance(entry, Mapping) or "value" not in entry:
            raise ProfileError(f"{path}: '{where}' must be a mapping with value, tag and source.")
        value = entry["value"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise ProfileError(f"{path}: '{where}.value' must be a non-negative number, not {value!r}.")
        tag = str(entry.get("tag", "INF"))
        if tag not in _TAGS:
            raise ProfileError(f"{path}: '{where}.tag' must be one of {', '.join(_TAGS)}, not {tag!r}.")
        params[key] = Param(key, float(value), tag, " ".join(str(entry.get("source", "")).split()),
                            bool(entry.get("fitted", False)))
    for key in ("npu_mhz", "mcu_mhz", "macs_per_cycle", "dw_macs_per_cycle", "eltwise_per_cycle"):
        if params[key].value <= 0:
            raise ProfileError(f"{path}: 'latency.{key}.value' must be above 0.")
    sw = data.get("sw_cycles_per_element")
    if not isinstance(sw, Mapping) or not isinstance(sw.get("kinds"), Mapping):
        raise ProfileError(f"{path}: 'latency.sw_cycles_per_element' must be a mapping with 'kinds', tag and source.")
    kinds: dict[str, dict[str, float]] = {}
    for kind in (*SW_KINDS, "elementwise"):
        entry = sw["kinds"].get(kind)
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{path}: 'latency.sw_cycles_per_element.kinds.{kind}' must give int8 and float cycles.")
        row = {}
        for k in ("int8", "float"):
            val = entry.get(k)
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val < 0:
                raise ProfileError(f"{path}: 'latency.sw_cycles_per_element.kinds.{kind}.{k}' must be a non-negative number.")
            row[k] = float(val)
        kinds[kind] = row
    return LatencyModel(params=params, sw_cycles=kinds, sw_tag=str(sw.get("tag", "INF")),
                        sw_source=" ".join(str(sw.get("source", "")).split()),
                        npu_mhz=params["npu_mhz"].value, mcu_mhz=params["mcu_mhz"].value)


# ------------------------------------------------------------------------------------------------
# Features: what each epoch computes and moves (independent of the parameters)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochWork:
    unit: str
    macs: float = 0.0  # dense MACs (HW) or MACs of a SW MAC op
    dw_macs: float = 0.0
    eltwise: float = 0.0  # element-wise work on the NPU (elements)
    act_bytes: float = 0.0  # activation bytes read and written
    weight_bytes: float = 0.0
    elements: float = 0.0  # SW/hybrid: elements the op touches
    kind: str = ""  # SW kind
    kernel: str = "int8"


@dataclass(frozen=True)
class MemoryRates:
    """Where bytes are read from: seconds per byte for activations and for weights."""

    act_s_per_byte: float
    weight_s_per_byte: float


@dataclass(frozen=True)
class LatencyEstimate:
    """Estimated time per inference (ms), per epoch and by unit. Estimated by nafix's cost model."""

    ms: float
    epoch_ms: tuple[float, ...]
    hw_ms: float
    sw_ms: float
    hybrid_ms: float
    overhead_ms: float
    npu_mhz: float
    mcu_mhz: float
    memory_bound_epochs: int = 0

    def as_dict(self) -> dict:
        return {"ms": round(self.ms, 3), "hw_ms": round(self.hw_ms, 3), "sw_ms": round(self.sw_ms, 3),
                "hybrid_ms": round(self.hybrid_ms, 3), "overhead_ms": round(self.overhead_ms, 3),
                "memory_bound_hw_epochs": self.memory_bound_epochs,
                "npu_mhz": self.npu_mhz, "mcu_mhz": self.mcu_mhz, "estimated": True}


def _numel(t) -> int:
    shape = getattr(t, "shape", None)
    if shape is None:
        return 0
    n = 1
    for d in shape:
        if not isinstance(d, int) or d < 0:
            return 0
        n *= d
    return n


def _const_numel(t) -> int:
    """Elements of a constant input, looking back through the folded nodes that produce it (a
    DequantizeLinear of an int8 initializer has no inferred shape of its own)."""
    for _ in range(4):
        n = _numel(t)
        if n or isinstance(t, ir.Constant) or not t.inputs:
            return n
        prod = t.inputs[0]
        if not prod.inputs:
            return 0
        t = prod.inputs[0]
    return 0


def _weight_tensor(view: GraphView, node) -> Any:
    i = 3 if node.op.startswith("QLinear") else 1
    return node.inputs[i] if len(node.inputs) > i else None


def _node_macs(view: GraphView, node) -> tuple[float, float]:
    """(dense MACs, depthwise MACs) of one node."""
    op = node.op
    if op not in _MAC_OPS or not node.outputs:
        return 0.0, 0.0
    out = _numel(node.outputs[0])
    if not out:
        return 0.0, 0.0
    w = _weight_tensor(view, node)
    wshape = getattr(w, "shape", None)
    if not wshape and w is not None and w.inputs and w.inputs[0].inputs:
        wshape = getattr(w.inputs[0].inputs[0], "shape", None)  # through the weights' DequantizeLinear
    if op in ("Conv", "QLinearConv", "ConvInteger"):
        if not wshape or len(wshape) < 3 or not all(isinstance(d, int) and d > 0 for d in wshape):
            return 0.0, 0.0
        per_out = 1
        for d in wshape[1:]:
            per_out *= d
        group = int(node.attrs.get("group", 1) or 1)
        macs = float(out) * per_out
        return (0.0, macs) if group > 1 and wshape[1] == 1 else (macs, 0.0)
    if op == "ConvTranspose":
        x = node.inputs[0].shape if node.inputs else None
        if not wshape or not x or not all(isinstance(d, int) and d > 0 for d in (*wshape, *x)):
            return 0.0, 0.0
        n = 1
        for d in x:
            n *= d
        per_in = 1
        for d in wshape[1:]:
            per_in *= d
        return float(n) * per_in, 0.0
    # Gemm / MatMul: output elements x the reduced dimension
    a = node.inputs[0].shape if node.inputs else None
    if not a or not isinstance(a[-1], int):
        return 0.0, 0.0
    k = a[-1]
    if op == "Gemm" and int(node.attrs.get("transA", 0) or 0) and len(a) >= 2 and isinstance(a[-2], int):
        k = a[-2]
    return float(out) * k, 0.0


def epoch_work(view: GraphView, placement, estimate) -> list[EpochWork]:
    """What each epoch of ``estimate`` computes and moves, from the graph (no parameters involved)."""
    nodes = view.by_name
    by_name = placement.by_name
    out: list[EpochWork] = []
    share: dict[str, int] = {}  # node -> HW epochs it is split over (wide kernels, extra epochs)
    slices: dict[str, int] = {}  # node -> SW/hybrid epochs made of it (an activation MatMul: one per slice)
    for g in estimate.groups:
        if g.unit == HW:
            for n in g.nodes:
                share[n] = share.get(n, 0) + 1
        elif g.nodes:
            slices[g.nodes[0]] = slices.get(g.nodes[0], 0) + 1
    for g in estimate.groups:
        members = [nodes[n] for n in g.nodes if n in nodes]
        if g.unit == HW:
            macs = dw = elt = 0.0
            acts = 0.0
            wbytes = 0.0
            inside = {o.name for m in members for o in m.outputs}
            for m in members:
                a, d = _node_macs(view, m)
                macs += a
                dw += d
                if not a and not d and m.outputs:
                    elt += _numel(m.outputs[0])
                for t in m.inputs:
                    if not t.name:
                        continue
                    if view.is_const_like(t):
                        if m.op in _MAC_OPS or m.op == "PRelu":
                            wbytes += _const_numel(t)
                        continue
                    if t.name not in inside:
                        acts += _numel(t)
                for o in m.outputs:
                    acts += _numel(o)
            if not members:  # an epoch of the compiler's own (input copy): reads and writes the input
                for t in view.graph.inputs:
                    if g.nodes and f"'{t.name}'" in g.nodes[0]:
                        acts += 2 * _numel(t)
            k = max((share.get(m.name, 1) for m in members), default=1)
            out.append(EpochWork(HW, macs=macs / k, dw_macs=dw / k, eltwise=elt / k, act_bytes=acts / k,
                                 weight_bytes=wbytes / k))
            continue
        # SW or hybrid: the op the epoch runs, on the elements of the node(s) it comes from
        op = g.reported_as or (g.ops[0] if g.ops else "")
        kind = sw_kind(op)
        p = by_name.get(g.nodes[0]) if g.nodes else None
        kernel = "float" if (p is not None and p.kernel == "float" and not g.inserted) else "int8"
        if g.unit == HYBRID:
            kernel = "int8"
        elems = 0.0
        macs = 0.0
        for m in members:
            n_in = max((_numel(t) for t in view.activations(m)), default=0)
            n_out = max((_numel(o) for o in m.outputs), default=0)
            elems = max(elems, float(n_in), float(n_out))
            if kind == "macs" and not g.inserted:
                a, d = _node_macs(view, m)
                macs += a + d
        if kind == "macs" and g.inserted:
            kind = "movement"  # an inserted Conv of a lowering moves data; its MACs are the node's (HW) work
        if kind == "macs" and members and members[0].op == "MatMul":
            macs = macs / max(1, slices.get(g.nodes[0], 1))  # one SW Conv epoch per batch slice
        out.append(EpochWork(g.unit, macs=macs, elements=elems, kind=kind, kernel=kernel))
    return out


def _pool_s_per_byte(pool, model: LatencyModel, npu_hz: float) -> float:
    """Seconds per byte of one pool: its ``byteWidth / freqRatio`` bytes per NPU cycle times the efficiency of
    its kind (on-chip RAM, external RAM or flash)."""
    width = pool.get("byte_width")
    ratio = pool.get("freq_ratio")
    on_chip = pool.get("on_chip")
    writable = pool.get("writable", True)
    if width is None or ratio is None or not width or not ratio:
        width = model.v("default_byte_width")
        ratio = 1.25 if on_chip else model.v("default_freq_ratio_external")
    eff = model.v("onchip_bw_efficiency") if on_chip else (
        model.v("external_bw_efficiency") if writable else model.v("flash_bw_efficiency"))
    bw = float(width) / float(ratio) * npu_hz * max(eff, 1e-9)
    return 1.0 / bw


def memory_placement(memory, pools, model: LatencyModel) -> MemoryRates:
    """Seconds per byte of activations and of weights, weighted by where the memory estimate puts them."""
    npu_hz = model.npu_mhz * 1e6
    props = {}
    for p in pools or ():
        props[p.name] = {"byte_width": p.byte_width, "freq_ratio": p.freq_ratio, "on_chip": p.on_chip,
                         "writable": p.writable}
    act = wts = 0.0
    act_n = wts_n = 0
    for row in memory.pools if memory is not None else ():
        info = props.get(row["pool"], {"on_chip": row["on_chip"], "writable": row["kind"] == "activations"})
        spb = _pool_s_per_byte(info, model, npu_hz)
        if row["kind"] == "activations":
            act += spb * row["bytes"]
            act_n += row["bytes"]
        else:
            wts += spb * row["bytes"]
            wts_n += row["bytes"]
    onchip = _pool_s_per_byte({"byte_width": 8, "freq_ratio": 1.25, "on_chip": True}, model, npu_hz)
    act_spb = act / act_n if act_n else onchip
    ext = getattr(memory, "external_bytes", 0) or 0
    if ext and act_n and getattr(memory, "unallocated_bytes", 0):
        # activations that fit no pool: read at the external RAM's rate
        ext_spb = _pool_s_per_byte({"on_chip": False, "writable": True}, model, npu_hz)
        act_spb = (act + ext_spb * memory.unallocated_bytes) / (act_n + memory.unallocated_bytes)
    wts_spb = wts / wts_n if wts_n else onchip
    return MemoryRates(act_spb, wts_spb)


def cost(work: list[EpochWork], where: MemoryRates, model: LatencyModel) -> LatencyEstimate:
    """Estimated ms per epoch and in total, from the epochs' work, where bytes sit, and the parameters."""
    npu_hz = model.npu_mhz * 1e6
    mcu_hz = model.mcu_mhz * 1e6
    mpc, dwpc, epc = model.v("macs_per_cycle"), model.v("dw_macs_per_cycle"), model.v("eltwise_per_cycle")
    hw_over = model.v("hw_epoch_overhead_us") * 1e-6
    sw_over = model.v("sw_epoch_overhead_us") * 1e-6
    hy_over = model.v("hybrid_epoch_overhead_us") * 1e-6
    cyc = model.sw_cycles
    per: list[float] = []
    hw = sw = hy = 0.0
    bound = 0
    for w in work:
        if w.unit == HW:
            compute = (w.macs / mpc + w.dw_macs / dwpc + w.eltwise / epc) / npu_hz
            memory = w.act_bytes * where.act_s_per_byte + w.weight_bytes * where.weight_s_per_byte
            if memory > compute:
                bound += 1
            t = max(compute, memory) + hw_over
            hw += t
        else:
            c = cyc[w.kind][w.kernel]
            amount = w.macs if w.kind == "macs" and w.macs else w.elements
            t = amount * c / mcu_hz + sw_over
            if w.unit == HYBRID:
                t += hy_over
                hy += t
            else:
                sw += t
        per.append(t * 1e3)
    over = model.v("inference_overhead_us") * 1e-3
    total = sum(per) + over
    return LatencyEstimate(ms=total, epoch_ms=tuple(round(x, 4) for x in per), hw_ms=hw * 1e3, sw_ms=sw * 1e3,
                           hybrid_ms=hy * 1e3, overhead_ms=over, npu_mhz=model.npu_mhz, mcu_mhz=model.mcu_mhz,
                           memory_bound_epochs=bound)


def estimate_latency(view: GraphView, placement, estimate, memory, profile, pools=None) -> LatencyEstimate | None:
    """The estimated time of one placed model (None when the profile has no latency data)."""
    model = latency_model(profile)
    if model is None:
        return None
    if pools is None:
        from .mpool import default_stm32n6_pools

        pools = default_stm32n6_pools()
    work = epoch_work(view, placement, estimate)
    return cost(work, memory_placement(memory, pools, model), model)
