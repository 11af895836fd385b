"""The ``--quantize`` stage of a fix: a float model rewritten (verified) then quantized by onnxruntime,
a uint8 model converted exactly to int8, a QDQ model's float islands quantized; with the accuracy
report of the result."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx

from ..gate import boundary_checks, change_contracts, loosest
from ..graph import is_quantized
from . import (
    CalibrationOptions, accuracy_report, check_finite_constants, convert_uint8_to_int8, open_calibration,
    quantize_float_model, requantize_islands,
)

if TYPE_CHECKING:
    from ..api import FixOptions
    from ..model_io import LoadedModel
    from ..npu.profile import TargetProfile


#: Rewrites that prepare float islands for quantization (they turn SW-only ops into NPU primitives,
#: which only pays off once the result is quantized): selected automatically with --quantize.
QUANTIZE_PREP_RULES = ("NAF016", "NAF017")
#: Below this output cosine (quantized vs float) the report warns: the calibration may be poor.
QUANT_MIN_COSINE = 0.99
#: Below this output cosine the quantized model is refused (--min-cosine's default): 1 - cosine is
#: about half the squared relative error, so 0.9 is an error of about 45 % of the output's norm, far
#: beyond int8 rounding (the report already warns below QUANT_MIN_COSINE, and MobileFaceNet's float
#: islands quantized came out at 1.0): such an output points at the calibration (wrong preprocessing,
#: random data for a model that needs real inputs), and the model is not worth writing.
QUANT_FAIL_COSINE = 0.9


def quantize_stage(loaded: LoadedModel, opts: FixOptions, profile: TargetProfile, warnings: list[str],
                    on_round, on_calibration=None) -> tuple:
    """--quantize: float model -> float rewrites (verified) -> onnxruntime quantization; uint8 model ->
    exact int8 conversion; QDQ model with float islands -> islands quantized keeping every existing
    scale and zero-point. Returns (quantized model, the float-stage engine result, report dict)."""
    from ..rules import load_rules, select_rules

    calib = opts.calib or CalibrationOptions(seed=opts.seed)
    model = loaded.model
    name = str(loaded.path)
    check_finite_constants(model, name)  # NaN/Inf weights: one sentence naming them, before any rewrite
    kind = _quant_kind(model)
    info: dict = {"input_kind": kind}
    pre_engine = None
    if kind == "float":
        # Float rewrites first (channel splits, Resize kernels, unrolled LSTM cells ...), then quantize.
        rules = select_rules(load_rules(opts.rules_dirs), select=opts.select, ignore=opts.ignore,
                         extend=opts.extend_select)
        extra = [r for r in load_rules(opts.rules_dirs) if r.id in QUANTIZE_PREP_RULES and r.id not in opts.ignore
                 and r not in rules]
        said: list[str] = []
        quantized, pre_engine = _quantize_float(model, rules + extra, opts, profile, calib, info, name, said,
                                                on_round, on_calibration)
        # the rewrites that only pay off once quantized are held to the never-worse guard there
        refused = _prep_guard(model, rules + extra, pre_engine, quantized, opts, profile, calib, name, on_round,
                              on_calibration)
        if refused is not None:
            quantized, pre_engine, info, said = refused
        warnings.extend(said)
    else:
        source = model
        if kind == "uint8":
            # uint8 activations -> int8 exactly (zero-point - 128, same scale), then as any QDQ model
            conv = convert_uint8_to_int8(model, model_name=name)
            info["uint8_conversion"] = conv.as_dict()
            warnings.extend(conv.warnings)
            if conv.exact:
                info["note"] = "activations converted exactly (zero-point - 128, same scale)"
            source = conv.model
        # Unroll recurrent ops inside the QDQ model first (float islands of NPU primitives), then
        # quantize the islands keeping every existing scale and zero-point.
        all_rules = load_rules(opts.rules_dirs)
        prep = [r for r in all_rules if r.id in QUANTIZE_PREP_RULES and r.id not in opts.ignore]
        prep += _requantizing_variants(all_rules, opts.select + opts.extend_select)
        pre_engine, model_in = _prep_rewrites(source, prep, opts, profile, info, name, on_round)
        res = requantize_islands(model_in, calib=calib, model_name=name, profile=profile, progress=on_calibration)
        quantized = res.model
        info.update(res.as_dict() if hasattr(res, "as_dict") else {"calibration": res.calibration})
        # what a requantizing rewrite created (NAF002's partial sums) must come out int8 like the rest:
        # say which stayed float (the whole run's estimate check then refuses the model)
        made = {n: r for n, r in pre_engine.provenance.items() if r in REQUANTIZING_RULES}
        left = [i["name"] for i in getattr(res, "remaining", ()) if i.get("name") in made]
        if left:
            warnings.append(f"{len(left)} node(s) that {', '.join(sorted({made[n] for n in left}))} created stayed in "
                            f"float after quantization ({', '.join(repr(n) for n in left[:5])}"
                            f"{', ...' if len(left) > 5 else ''}); onnxruntime did not quantize them")
        feeds = open_calibration(model, calib, model_name=name).take(min(8, calib.max_samples))
        # the reference is itself quantized: per-tensor SQNR against it says nothing, outputs do
        acc = accuracy_report(model, quantized, feeds, calibration=res.calibration, worst=0)
        if res.calibration == "none":
            info["calibration"] = "none"  # no island needed onnxruntime: nothing was calibrated
        info.update(acc.as_dict())
    low = [o for o in info.get("outputs", []) if o.get("cosine") is not None and o["cosine"] < QUANT_MIN_COSINE]
    for o in low:
        warnings.append(f"quantized output '{o['name']}' has cosine {o['cosine']:.4f} against the float model "
                        f"(below {QUANT_MIN_COSINE}); check the calibration data")
    return quantized, pre_engine, info


def _quantize_float(model, rules, opts: FixOptions, profile: TargetProfile, calib, info: dict, name: str,
                    warnings: list[str], on_round, on_calibration):
    """A float model's --quantize pass: the float rewrites of ``rules`` (verified), then onnxruntime
    quantization and the accuracy report, recorded in ``info``. Returns (quantized model, the
    float-stage engine result)."""
    pre_engine, float_model, gate = _prep_engine(model, rules, opts, profile, info, name, on_round)
    n_feeds = min(8, calib.max_samples)
    # The accuracy report compares the quantized model with ``model`` on the first calibration
    # samples. onnxruntime's calibration runs the float model on them anyway: its outputs there
    # are the report's reference when the model it calibrates computes bit for bit what
    # ``model`` does (no float rewrite, or only rewrites held to the bit-exact contract).
    exact = float_model is model or gate.contract.contract == "exact"
    # The rewrites' gate runs ``model`` on seeded random inputs, which are the first random
    # calibration samples when the seeds agree (the defaults): it runs within the accuracy report,
    # which runs ``model`` on those very inputs, and takes its values from those runs. Its verdict
    # still comes before anything else: before quantization's errors, before the report's figures.
    try:
        q = quantize_float_model(float_model, calib=calib, model_name=name, profile=profile,
                                 progress=on_calibration, keep_reference=n_feeds if exact else 0)
        quantized = q.model
        info.update(q.as_dict())
        warnings.extend(q.warnings)
        if q.reference:
            feeds, reference = [f for f, _ in q.reference], [r for _, r in q.reference]
        else:
            feeds, reference = open_calibration(float_model, calib, model_name=name).take(n_feeds), None
        q.reference = []
        acc = accuracy_report(model, quantized, feeds, calibration=q.calibration, reference=reference,
                              meanwhile=gate.check if gate is not None else None)
        del feeds, reference
    except Exception:
        if gate is not None and not gate.done:
            gate.check()  # the gate's failure is the error, as when it ran first
        raise
    if gate is not None and not gate.done:
        gate.check()
    info.update(acc.as_dict())
    return quantized, pre_engine


def _prep_guard(model, rules, pre_engine, quantized, opts: FixOptions, profile: TargetProfile, calib, name: str,
                on_round, on_calibration):
    """The never-worse guard for the rewrites that only pay off once quantized (QUANTIZE_PREP_RULES:
    the engine runs them unguarded on the float model, where every node is SW): the model is
    quantized again without them and both quantized models are estimated (the guard's test,
    :func:`fixer.engine.worse_than_input`, with the run's memory pools). When the model with them is
    estimated worse, they are not kept: returns (quantized model, float-stage engine result, report
    dict, warnings) of the pass without them, the refused changes among its near-misses with both
    estimated times; else None. One pass without all of them (not one per rule)."""
    from ..analysis import analyze_model
    from ..options import resolve_pools
    from ..engine import NearMissReport, rank_near_misses, worse_than_input
    from ..shapes import refresh_shapes

    made = [c for c in pre_engine.changes if c.rule in QUANTIZE_PREP_RULES]
    if not made:
        return None
    pools = resolve_pools(opts.analysis)

    def estimate(m):
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
        return analyze_model(refresh_shapes(copy), profile=profile, pools=pools).estimate

    with_them = estimate(quantized)
    if with_them.latency_ms is None:
        return None
    prep = {c.rule for c in made}
    info: dict = {"input_kind": "float"}
    warnings: list[str] = []
    q2, pre2 = _quantize_float(model, [r for r in rules if r.id not in prep], opts, profile, calib, info, name,
                               warnings, on_round, on_calibration)
    without = estimate(q2)
    worse = worse_than_input(without, with_them)
    if worse is None:
        return None
    reason = (f"not kept: quantized with the {', '.join(sorted(prep))} rewrites the model is estimated at "
              f"{with_them.latency_ms:.3f} ms, without them at {without.latency_ms:.3f} ms ({worse}; nafix never "
              "makes the estimate worse)")
    pre2.near_misses = rank_near_misses(pre2.near_misses + [
        NearMissReport(c.rule, c.node, c.op_type, reason, ms_before=without.latency_ms, ms_after=with_them.latency_ms)
        for c in made])
    info["float_rewrites_refused"] = [{"rule": c.rule, "node": c.node, "ms_with": round(with_them.latency_ms, 3),
                                       "ms_without": round(without.latency_ms, 3)} for c in made]
    return q2, pre2, info, warnings


class _RewritesGate:
    """The equivalence gate of the rewrites before quantization (:func:`_prep_engine`), run once by
    :meth:`check`, which records it in ``info['float_rewrites']`` and raises when it fails."""

    def __init__(self, model, pre, rules, opts: FixOptions, info: dict, name: str):
        by_id = {r.id: r for r in rules}
        self.model, self.pre, self.opts, self.info, self.name = model, pre, opts, info, name
        self.contract = loosest([by_id[r].verify for r in pre.rules_applied])
        # where a rewrite may move a quantized tensor by LSBs (NAF002 on a QDQ model): its int8 tensors
        # are checked under its contract, and outputs downstream against the noise floor (verify())
        contracts = change_contracts(pre, by_id)
        self.boundaries = [b for b in boundary_checks(pre, contracts) if b.contract.contract == "lsb"]
        self.done = False
        info["float_rewrites"] = None  # its place among the report's keys, filled by check()

    def check(self, original_run=None):
        """``original_run``: see :func:`~fixer.gate.verify` (the original's values from elsewhere)."""
        from ..errors import VerificationError
        from ..gate import verify

        self.done = True
        pre = self.pre
        v = verify(self.model, pre.model, contract=self.contract, rules=pre.rules_applied, seed=self.opts.seed,
                   samples=self.opts.samples, original_run=original_run, boundaries=self.boundaries)
        self.info["float_rewrites"] = {"changes": [{"rule": c.rule, "node": c.node, "detail": c.detail}
                                                   for c in pre.changes], "verification": v.as_dict()}
        if not v.ok:
            raise VerificationError(f"{self.name}: the rewrites before quantization failed verification (rules "
                                    f"{', '.join(pre.rules_applied)}: {v.failure()}); nothing written.")
        return v


def _prep_engine(model, rules, opts: FixOptions, profile: TargetProfile, info: dict, name: str, on_round):
    """:func:`_prep_rewrites` with the gate left to run (None when nothing changed): returns (engine
    result, model to quantize, gate)."""
    from ..engine import run_engine

    # no guard: on a float model these rewrites add SW nodes that only pay off once quantized
    pre = run_engine(model, rules, profile=profile, options={"input_type": "int8"}, max_rounds=opts.max_rounds,
                     on_round=on_round, guard=False)
    if not pre.changes:
        return pre, model, None
    return pre, pre.model, _RewritesGate(model, pre, rules, opts, info, name)


def _prep_rewrites(model, rules, opts: FixOptions, profile: TargetProfile, info: dict, name: str, on_round):
    """Run the rewrites that come before quantization and verify them against ``model`` under their
    contracts; recorded in ``info['float_rewrites']``. Returns (engine result, model to quantize)."""
    pre, out, gate = _prep_engine(model, rules, opts, profile, info, name, on_round)
    if gate is not None:
        gate.check()
    return pre, out


#: Rewrites of quantized ops that need new quantization parameters (the NAF002 partial sums): under
#: --quantize, when selected, they run on the QDQ model and their new tensors are calibrated.
REQUANTIZING_RULES = ("NAF002",)


def _requantizing_variants(rules, select) -> list:
    """The selected REQUANTIZING_RULES, with their float-only precondition lifted."""
    from dataclasses import replace

    from ..rules import VerifyContract

    chosen = {s.upper() for s in select} | {r.id for r in rules if r.name in select}
    out = []
    for r in rules:
        if r.id in REQUANTIZING_RULES and r.id in chosen:
            # the split is exact in real arithmetic; summed in float in another order, a value at a
            # rounding tie of the QuantizeLinear after it can move by one LSB (99.99 % bit-exact on a
            # 257 -> 257 Conv): its contract on a QDQ model is one LSB of the output quantization
            # (rtol where an output is float), downstream outputs judged against the noise floor
            out.append(replace(r, when=tuple(c for c in r.when if c.predicate != "is_float"),
                               params={**r.params, "quantized_ok": True},
                               verify=VerifyContract("lsb", rtol=r.verify.rtol, atol=r.verify.atol, lsb=1.0)))
    return out


def _quant_kind(model) -> str:
    """float (no quantization), uint8 (uint8 activations inside), or qdq."""
    import numpy as np
    from onnx import numpy_helper

    if not is_quantized(model):
        return "float"
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits:
            if numpy_helper.to_array(inits[n.input[2]]).dtype == np.uint8:
                return "uint8"
    return "qdq"
