"""The noise floor: how much the graph outputs move when only rounding changes at the rewritten nodes
(the original model with random +-1 LSB noise injected there), and a rewrite's deviation judged against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx

from .metrics import _dot, _norm, _output_scales
from .parts import _toposort
from .runs import session


#: Draws of the random +-1 LSB noise per input set when measuring the floor.
NOISE_DRAWS = 8
#: A rewrite is accepted when each deviation is at most the floor's mean times this factor plus
#: NOISE_STD_MARGIN standard deviations of the floor (and rejected beyond).
NOISE_MEAN_FACTOR = 1.5
NOISE_STD_MARGIN = 3.0


@dataclass(frozen=True)
class Deviation:
    """How far outputs moved from the original's: 1 - cosine, max abs difference (in LSB where the
    output is quantized), and the fraction of argmax positions (per heatmap channel, or per row of a
    classifier) that changed."""

    cosine: float
    max_lsb: float
    argmax_changed: float | None
    unit: str = "LSB"

    def as_dict(self) -> dict:
        return {"cosine": self.cosine, "max_diff": self.max_lsb, "unit": self.unit,
                "argmax_changed": self.argmax_changed}


@dataclass(frozen=True)
class NoiseFloor:
    """The deviations rounding noise alone causes (one per draw) and the rate it was injected at."""

    draws: tuple[Deviation, ...]
    rates: Mapping[str, float]

    def stat(self, what: str) -> tuple[float, float]:
        v = np.array([getattr(d, what) for d in self.draws], dtype=np.float64)
        return float(v.mean()), float(v.std())

    def as_dict(self) -> dict:
        cm, cs = self.stat("cosine")
        out = {"cosine_mean": cm, "cosine_std": cs, "draws": len(self.draws),
               "max_diff_range": [min(d.max_lsb for d in self.draws), max(d.max_lsb for d in self.draws)],
               "unit": self.draws[0].unit, "injected_rates": dict(self.rates)}
        if self.draws[0].argmax_changed is not None:
            am, ast = self.stat("argmax_changed")
            out.update({"argmax_changed_mean": am, "argmax_changed_std": ast})
        return out


def _argmax_rows(x: np.ndarray) -> np.ndarray | None:
    """Argmax per heatmap channel (rank 4: over the spatial positions, channel axis guessed as the
    smallest of axes 1 and 3) or per row of a classifier (rank 2-3: over the last axis)."""
    if x.ndim == 4:
        if x.shape[3] < x.shape[1] and x.shape[3] < x.shape[2]:  # NHWC
            x = np.moveaxis(x, 3, 1)
        return x.reshape(x.shape[0] * x.shape[1], -1).argmax(axis=1)
    if x.ndim in (2, 3) and x.shape[-1] > 1:
        return x.reshape(-1, x.shape[-1]).argmax(axis=1)
    return None


def output_deviation(ref: Sequence[np.ndarray], got: Sequence[np.ndarray], scale: float | None) -> Deviation:
    a = np.concatenate([np.asarray(r, np.float64).reshape(-1) for r in ref])
    b = np.concatenate([np.asarray(g, np.float64).reshape(-1) for g in got])
    na, nb = _norm(a), _norm(b)
    cos = float(_dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    changed = None
    rows = [(_argmax_rows(np.asarray(r)), _argmax_rows(np.asarray(g))) for r, g in zip(ref, got)]
    if rows and all(x is not None for x, _ in rows):
        total = sum(x.size for x, _ in rows)
        changed = float(sum(int(np.sum(x != y)) for x, y in rows) / max(total, 1))
    return Deviation(cos, diff / scale if scale else diff, changed, "LSB" if scale else "abs")


def judge_against_floor(dev: Deviation, floor: NoiseFloor) -> tuple[bool, str]:
    """Accept when every deviation of the rewrite (1 - cosine, max difference, argmax changes) is
    within NOISE_MEAN_FACTOR x the floor's mean + NOISE_STD_MARGIN x its standard deviation."""
    verdicts = []
    d_m, d_s = floor.stat("cosine")
    lim_cos = 1.0 - (NOISE_MEAN_FACTOR * (1.0 - d_m) + NOISE_STD_MARGIN * d_s)
    verdicts.append(dev.cosine >= lim_cos - 1e-12)
    m_m, m_s = floor.stat("max_lsb")
    lim_max = NOISE_MEAN_FACTOR * m_m + NOISE_STD_MARGIN * m_s
    verdicts.append(dev.max_lsb <= lim_max + 1e-9)
    arg = ""
    if dev.argmax_changed is not None and floor.draws[0].argmax_changed is not None:
        a_m, a_s = floor.stat("argmax_changed")
        lim_arg = NOISE_MEAN_FACTOR * a_m + NOISE_STD_MARGIN * a_s
        verdicts.append(dev.argmax_changed <= lim_arg + 1e-12)
        arg = (f", argmax changed on {dev.argmax_changed:.1%}", f", argmax changed on {a_m:.1%} +- {a_s:.1%}")
    ok = all(verdicts)
    unit = dev.unit
    lo = min(d.max_lsb for d in floor.draws)
    hi = max(d.max_lsb for d in floor.draws)
    rate = max(floor.rates.values())
    text = (f"rewrite: cosine {dev.cosine:.4f}, max {dev.max_lsb:.3g} {unit}{arg[0] if arg else ''}; "
            f"rounding noise alone (+-1 LSB at up to {rate:.2%} of the rewritten nodes' outputs, "
            f"{len(floor.draws)} draws): cosine {d_m:.4f} +- {d_s:.4f}, max {lo:.3g}-{hi:.3g} {unit}"
            f"{arg[1] if arg else ''} ({'accepted' if ok else 'rejected'}: each figure must stay within "
            f"{NOISE_MEAN_FACTOR:g}x the noise mean + {NOISE_STD_MARGIN:g} std)")
    return ok, text


def noise_floor(original: onnx.ModelProto, rates: Mapping[str, float], feeds: Sequence[Mapping[str, np.ndarray]],
                refs: Mapping[str, list[np.ndarray]], examples: Mapping[str, np.ndarray], *, seed: int = 0,
                draws: int = NOISE_DRAWS, below: tuple | None = None) -> dict[str, NoiseFloor]:
    """Run the ORIGINAL model with random +-1 LSB noise added to each tensor of ``rates`` (integer
    tensors right after rewritten nodes) at that rate, ``draws`` times over ``feeds``, and measure how
    far the outputs ``refs`` move: the deviation rounding differences alone cause. One session.

    ``below``: (the :class:`Downstream` part of the original below a set of tensors that holds every
    tensor of ``rates``, the original's values per feed of every tensor that part reads). The noise
    changes nothing above the noisy tensors, so only that part runs on each draw, fed the original's
    values (the same values the whole model computes there: the floor is the same)."""
    names = list(refs)
    per_draw = None
    if below is not None:
        part, values = below
        inside = [n for n in names if n in part.produced]
        if (set(rates) <= set(part.tensors) and len(values) == len(feeds)
                and all(t in v for v in values for t in part.inputs)):
            try:
                per_draw = _noisy_draws(part.typed([values[0][t] for t in part.inputs], inside), rates,
                                        [{t: v[t] for t in part.inputs} for v in values], inside, examples, seed, draws)
            except Exception:  # noqa: BLE001 - the part does not run on its own: the whole model runs
                per_draw = None
            if per_draw is not None:
                # an output no noisy tensor reaches: the original's own values, which every draw computes
                for outs in per_draw:
                    outs.update({n: list(refs[n]) for n in names if n not in inside})
    if per_draw is None:
        per_draw = _noisy_draws(original, rates, feeds, names, examples, seed, draws)
    scales = _output_scales(original)
    out = {}
    for n in names:
        devs = tuple(output_deviation(refs[n], d[n], scales.get(n)) for d in per_draw)
        out[n] = NoiseFloor(devs, dict(rates))
    return out


def _noisy_draws(model: onnx.ModelProto, rates: Mapping[str, float], feeds: Sequence[Mapping[str, np.ndarray]],
                 names: Sequence[str], examples: Mapping[str, np.ndarray], seed: int, draws: int) -> list[dict]:
    """``names`` of ``model`` with the noise of :func:`noise_floor` injected, per draw and feed (one session)."""
    model, noise_inputs = _with_noise(model, {t: np.asarray(examples[t]).dtype for t in rates})
    sess = session(model) if names else None
    shapes = {t: list(np.asarray(examples[t]).shape) for t in rates}
    rng = np.random.default_rng([seed, 7])
    per_draw: list[dict[str, list[np.ndarray]]] = []
    for _ in range(draws):
        outs: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feed in feeds:
            f = dict(feed)
            for t, inp in noise_inputs.items():
                flip = rng.random(shapes[t]) < rates[t]
                sign = np.where(rng.random(shapes[t]) < 0.5, -1.0, 1.0)
                f[inp] = (flip * sign).astype(np.float32)
            if sess is not None:
                for n, v in zip(names, sess.run(list(names), f)):
                    outs[n].append(np.asarray(v))
        per_draw.append(outs)
    return per_draw


def _with_noise(model: onnx.ModelProto, tensors: Mapping[str, np.dtype]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with each integer tensor ``t`` of ``tensors`` replaced, for its readers, by
    clip(t + noise_t, type range), ``noise_t`` a new float graph input; returns (model, {t: input})."""
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inputs: dict[str, str] = {}
    new_nodes = []
    for k, (t, dt) in enumerate(tensors.items()):
        info = np.iinfo(dt)
        to = helper.np_dtype_to_tensor_dtype(dt)
        noisy, inp = f"{t}__nafix_noisy", f"{t}__nafix_noise"
        for node in m.graph.node:
            for i, x in enumerate(node.input):
                if x == t:
                    node.input[i] = noisy
        lo, hi = f"{t}__nafix_lo", f"{t}__nafix_hi"
        m.graph.initializer.extend([onnx.numpy_helper.from_array(np.array(info.min, np.float32), lo),
                                    onnx.numpy_helper.from_array(np.array(info.max, np.float32), hi)])
        new_nodes += [
            helper.make_node("Cast", [t], [f"{t}__nafix_f"], name=f"{t}__nafix_cast", to=TensorProto.FLOAT),
            helper.make_node("Add", [f"{t}__nafix_f", inp], [f"{t}__nafix_sum"], name=f"{t}__nafix_add"),
            helper.make_node("Clip", [f"{t}__nafix_sum", lo, hi], [f"{t}__nafix_clip"], name=f"{t}__nafix_clip"),
            helper.make_node("Cast", [f"{t}__nafix_clip"], [noisy], name=f"{t}__nafix_back", to=to),
        ]
        m.graph.input.append(helper.make_tensor_value_info(inp, TensorProto.FLOAT, None))
        inputs[t] = inp
    # the injection reads each tensor right after its producer: append, then sort topologically
    nodes = list(m.graph.node) + new_nodes
    del m.graph.node[:]
    m.graph.node.extend(_toposort(nodes, {i.name for i in m.graph.input} | {t.name for t in m.graph.initializer}))
    return m, inputs
