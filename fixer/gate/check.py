"""The equivalence gate: run the original and the rewritten model in onnxruntime on the same inputs
and judge every output under the verify contract of the rules that were applied.

Inputs are seeded random data in each input's dtype and plausible range (for a float input that feeds
a QuantizeLinear, the range its quantization can represent), or the user's ``--inputs file.npz``.
Where a rule changed the model's interface (int8 graph edges), the fixed model is fed the quantized
input and its int8 output is dequantized with the recorded scale and zero-point before comparison.

This module is the gate itself (:func:`verify`); its rooms: :mod:`.inputs`, :mod:`.runs`,
:mod:`.parts`, :mod:`.noise`, :mod:`.metrics`, and the contracts (:mod:`.contracts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from ..rewriters import IoChange
from . import runs
from .contracts import VerifyContract
from .inputs import make_inputs, original_failed
from .metrics import (PROPAGATED_MIN_COSINE, BoundaryCheck, OutputCheck, _as_int8_if_shifted, _edge_in, _edge_out,
                      _output_scales, _scalar, compare)
from .noise import NOISE_MEAN_FACTOR, NOISE_STD_MARGIN, judge_against_floor, noise_floor, output_deviation
from .parts import (_downstream, _Facts, _isolated_boundaries, _PartRun, _RewrittenRun, _WholeRun, fixed_part,
                    proven_equal, rewritten_part)
from .runs import _begin_fixed, _fixed_session, _sharing_segment_workers


@dataclass
class Verification:
    ok: bool
    contract: VerifyContract
    rules: list[str]
    outputs: list[OutputCheck] = field(default_factory=list)
    inputs: str = "random"
    samples: int = 0
    boundaries: list[OutputCheck] = field(default_factory=list)
    propagated: bool = False
    #: A passed verdict that rests on random inputs while some output moved a lot
    #: (:func:`large_moves`): one sentence saying so and suggesting --inputs; None otherwise.
    caution: str | None = None

    def failure(self) -> str | None:
        """What failed, as a phrase (None when the verdict passed): each output and rewritten node that
        broke its contract, with the first clause of its detail; at most three, then a count."""
        if self.ok:
            return None
        bad = [(f"output '{o.name}'" if o.name != "<model>" else "the model", o) for o in self.outputs if not o.ok]
        bad += [(f"rewritten node at {o.name}", o) for o in self.boundaries if not o.ok]
        parts = [f"{what}: {o.detail.split('; ')[0]}" for what, o in bad[:3]]
        if len(bad) > 3:
            parts.append(f"{len(bad) - 3} more")
        return "; ".join(parts) or "no output was compared"

    def as_dict(self) -> dict:
        text = self.contract.describe()
        if self.propagated:
            text = (f"{text} at each rewritten node; graph outputs, where those differences propagate "
                    f"through later layers: within the deviation random +-1 LSB rounding noise at the rewritten "
                    f"nodes causes ({NOISE_MEAN_FACTOR:g}x its mean + {NOISE_STD_MARGIN:g} std)")
        return {
            "ok": self.ok, "contract": self.contract.contract, "contract_text": text, "failed": self.failure(),
            "rules": self.rules, "inputs": self.inputs, "samples": self.samples,
            "outputs": [o.as_dict() for o in self.outputs],
            "rewritten_nodes": [o.as_dict() for o in self.boundaries],
            "caution": self.caution,
        }


#: An output whose cosine against the original's is below this moved a lot: 1 - cosine is half the
#: squared relative error for small errors, so 0.95 means an error of about 30 % of the output's norm
#: (a rewrite held to 1 LSB changes a healthy output's cosine in the 4th digit or later).
LARGE_MOVE_COSINE = 0.95
#: ... or whose argmax (per heatmap channel, or per classifier row) changed on more than this fraction.
LARGE_MOVE_ARGMAX = 0.10


def large_moves(checks: Sequence[OutputCheck], values: Mapping[str, list]) -> list[str]:
    """The passed outputs that moved a lot (cosine below LARGE_MOVE_COSINE, or argmax changed on more
    than LARGE_MOVE_ARGMAX), each as a phrase with its figures and why it was accepted.
    ``values``: output name -> [(original, fixed)] per input set."""
    out = []
    for c in checks:
        if not c.ok or c.max_abs_error == 0.0 or c.name not in values:
            continue
        dev = output_deviation([r for r, _ in values[c.name]], [g for _, g in values[c.name]], None)
        argmax = dev.argmax_changed
        if dev.cosine >= LARGE_MOVE_COSINE and (argmax is None or argmax <= LARGE_MOVE_ARGMAX):
            continue
        why = "accepted against the noise floor" if c.noise_floor is not None else "accepted by its contract"
        out.append(f"'{c.name}' (cosine {dev.cosine:.4f}"
                   + (f", argmax changed on {argmax:.1%}" if argmax is not None else "") + f"; {why})")
    return out


def caution_text(moves: Sequence[str], samples: int) -> str:
    """The one sentence said when a verdict on random inputs accepted outputs that moved a lot."""
    return (f"this verdict rests on {samples} seeded random input set(s), on which {', '.join(moves)} moved a "
            f"lot: random data may not exercise the model as real inputs do; check with real inputs (--inputs "
            f"FILE.npz)")


@_sharing_segment_workers
def verify(
    original: onnx.ModelProto,
    fixed: onnx.ModelProto,
    *,
    contract: VerifyContract,
    rules: Sequence[str] = (),
    io_changes: Sequence[IoChange] = (),
    inputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    seed: int = 0,
    samples: int = 3,
    boundaries: Sequence[BoundaryCheck] = (),
    original_run: Callable[[Mapping[str, np.ndarray], list[str]], list | None] | None = None,
) -> Verification:
    """Run both models on the same inputs; every output must satisfy ``contract``, and every
    boundary tensor its rule's contract. When a contract allows LSB differences at a rewritten node
    (``lsb`` > 0), a graph output downstream that differs is judged against the noise floor: the
    original model run with random +-1 LSB rounding noise injected at the rewritten nodes' outputs,
    at the rate the rewrite differs there (:func:`noise_floor`); both figures are reported.

    onnxruntime sessions: one for the original model (graph outputs, boundary tensors and the
    tensors the rewritten regions read, all in one run), one for the fixed model with all the
    isolated rewritten regions (:class:`_WholeRun`; apart where they do not join it), and one for the
    noise-injected original when it is needed (a graph of :data:`fixer.segments.SEGMENT_FROM` nodes
    or more: one session per segment of it, made by threads the gate shares between the two models,
    the same values; :func:`begin_session`). Where :func:`fixed_part` applies, the fixed model's
    session only proves it loads: what runs is the part below what is provably equal to the original
    (:func:`proven_equal`), fed the original's values there, with the isolated regions in that same
    session; its outputs are those of the whole fixed model, bit for bit (onnxruntime computes each
    node from its inputs alone). Before the part (or the whole fixed model), where
    :func:`rewritten_part` applies, the rewritten nodes alone run on the original's values (one more
    small session): on an input set where they compute the original's values bit for bit, every
    tensor of the fixed model is the original's, and nothing else of the fixed model runs on it; the
    fixed model's session is then its own (the regions join it only from the first input set the
    rewritten nodes do not prove), and where they prove every input set, so do the isolated regions,
    which do not run apart either.

    ``original_run(feed, names)``: the original model's values of ``names`` on ``feed`` (a list in
    that order) from a run made elsewhere, by onnxruntime without graph optimizations (the same
    kernels on the same inputs: the same bits), or None, and the gate's own session runs it (the
    accuracy report of --quantize runs the original on the gate's seeded inputs).

    The steps (plan, sessions, run, judge): :class:`Gate`."""
    return Gate(original, fixed, contract=contract, rules=rules, io_changes=io_changes, inputs=inputs, seed=seed,
                samples=samples, boundaries=boundaries, original_run=original_run).verdict()


class Gate:
    """The equivalence gate on one pair of models (:func:`verify`), in named steps: :meth:`plan`
    (what the original's run fetches besides its outputs, which parts of the fixed model run apart),
    :meth:`sessions` (begun, then waited for; the inputs made), :meth:`run` (both models on every
    input set) and :meth:`judge` (every output and rewritten node under its contract).
    :meth:`sessions` and :meth:`run` return the failed verdict where they reach one (the fixed model
    does not load, lacks an output the original has, or fails in onnxruntime), else None."""

    def __init__(self, original: onnx.ModelProto, fixed: onnx.ModelProto, *, contract: VerifyContract,
                 rules: Sequence[str] = (), io_changes: Sequence[IoChange] = (),
                 inputs: Sequence[Mapping[str, np.ndarray]] | None = None, seed: int = 0, samples: int = 3,
                 boundaries: Sequence[BoundaryCheck] = (),
                 original_run: Callable[[Mapping[str, np.ndarray], list[str]], list | None] | None = None):
        self.original, self.fixed = original, fixed
        self.contract, self.rules, self.io_changes = contract, rules, io_changes
        self.inputs, self.seed, self.samples = inputs, seed, samples
        self.boundaries = boundaries
        self.original_run = original_run
        self.src = "npz" if inputs is not None else "random"

    def verdict(self) -> Verification:
        """The steps in order: the first verdict reached."""
        self.plan()
        failed = self.sessions()
        if failed is None:
            failed = self.run()
        return failed if failed is not None else self.judge()

    def _failed(self, checks: list[OutputCheck]) -> Verification:
        return Verification(False, self.contract, list(self.rules), checks, self.src, len(self.feeds))

    # -- plan -------------------------------------------------------------------------------------

    def plan(self) -> None:
        """What each run fetches and which parts run apart (no session yet)."""
        original, fixed, contract = self.original, self.fixed, self.contract
        orig_names = {o.name for o in original.graph.output}
        facts = self.facts = _Facts(original, fixed)
        both = facts.o_made & facts.f_made
        boundaries = self.boundaries = [b for b in self.boundaries if b.tensor in both and b.tensor not in orig_names]
        extra = self.extra = sorted({b.tensor for b in boundaries})
        known = facts.o_made | {i.name for i in original.graph.input}
        capture = sorted({t for b in boundaries if b.inputs for t in b.inputs if t in known} - set(extra) - orig_names)
        # a noise floor may be measured (an LSB-tolerant rewrite under an LSB contract): the original's
        # run also keeps the tensors the part of the model below the rewritten nodes reads, so the noisy
        # runs evaluate that part alone (the layers above them compute the same values on every draw)
        noisy = sorted({b.tensor for b in boundaries if b.contract.contract == "lsb" and b.contract.lsb > 0})
        cut = self.cut = _downstream(original, noisy) if noisy and contract.contract == "lsb" else None
        if cut is not None:
            capture = sorted(set(capture) | (set(cut.inputs) - set(extra) - orig_names
                                             - {i.name for i in original.graph.input}))
        self.capture = capture
        in_changes = self.in_changes = {c.name: c for c in self.io_changes if c.kind == "input"}
        out_changes = self.out_changes = {c.name: c for c in self.io_changes if c.kind == "output"}
        # the fixed model runs only below what is provably equal to the original (fed the original's
        # values there, which its run then also fetches); the whole fixed model still loads in a session
        wanted = [o.name for o in original.graph.output if o.name not in extra] + extra
        proof = proven_equal(original, fixed, in_changes, facts=facts)
        fpart = self.fpart = fixed_part(original, fixed, in_changes, wanted, proof=proof, facts=facts)
        # the part's frontier: fetched only where the part runs
        self.front = [] if fpart is None else sorted(set(fpart.frontier) - set(extra) - orig_names - set(capture))
        # before the part, the rewritten nodes alone (:func:`rewritten_part`): where they compute the
        # original's values on an input set, so does the whole fixed model, and neither the part nor the
        # whole fixed model runs on it (the original's run fetches what they read and compute)
        rpart = self.rpart = rewritten_part(original, fixed, proof, wanted, bool(in_changes or out_changes),
                                            fpart.part.model.graph.node if fpart is not None else None, facts=facts)
        o_inputs = {i.name for i in original.graph.input}
        self.rcap = ([] if rpart is None else
                     sorted((set(rpart.part.inputs) | set(rpart.checked)) - set(extra) - set(capture) - orig_names
                            - o_inputs))

    # -- sessions ---------------------------------------------------------------------------------

    def sessions(self) -> Verification | None:
        """Begin the sessions, wait for the original's, make the inputs; the fixed model's is waited
        for here unless the rewritten nodes run apart first."""
        original, fixed, facts = self.original, self.fixed, self.facts
        extra, capture, front, rcap = self.extra, self.capture, self.front, self.rcap
        rpart, fpart = self.rpart, self.fpart
        # the sessions are begun, then waited for: the gate's shared threads make the original's first,
        # then, where the gate will use it (no whole-model run with the regions), the fixed model's,
        # while the gate goes on (onnxruntime releases the GIL while it loads and plans a model; a large
        # graph's segments are each such a session)
        self.early = None
        try:
            o_begun = runs.begin_session(original, extra=extra + capture + sorted(set(front) | set(rcap)),
                                         names=facts.o.names)
        except Exception as exc:  # noqa: BLE001 - onnxruntime rejects the original: an input problem, said once
            raise original_failed(exc) from None
        # where the rewritten nodes apart or the part below what is proven equal may run in its place,
        # the fixed model's session may only prove that it loads: a large graph's segment sessions are
        # then dropped once made (made again if it runs after all), so the gate does not hold both
        # models' sessions (the 31k-node QDQ chain's fix peaked at 876 MiB instead of 1,138)
        self.keep_fixed = rpart is None and fpart is None
        if rpart is not None or not (fpart is None and any(b.inputs for b in self.boundaries)):
            self.early = _begin_fixed(fixed, extra, self.keep_fixed, facts.f.names)
        try:
            s_orig = self.s_orig = o_begun.ready()
        except Exception as exc:  # noqa: BLE001 - onnxruntime rejects the original: an input problem, said once
            if self.early is not None:
                _fixed_session(self.early)  # no session left loading behind the error
            raise original_failed(exc) from None
        self.feeds = (list(self.inputs) if self.inputs is not None
                      else make_inputs(original, seed=self.seed, samples=self.samples, sess=s_orig))
        fetched = set(extra) | set(capture) | set(front) | set(rcap)
        self.names = [o.name for o in s_orig.get_outputs() if o.name not in fetched]
        self.whole = self._build_whole() if rpart is None else None
        self.s_fix = None
        self.fixed_inputs: set[str] = set()
        # with the rewritten nodes apart, the fixed model is waited for only where an input set needs it
        # or at the end (its verdict is the same then): a large graph's segments go on loading in the
        # shared threads while the original runs and the rewritten nodes are checked
        if rpart is None and (failed := self._fixed_ready()) is not None:
            return failed
        return None

    def _build_whole(self):
        """No part: the whole fixed model runs, with the isolated rewritten regions in its session
        (which loads only where the fixed model does); they read what each input set's captured
        values hold. Where the rewritten nodes may prove every input set, that session waits for the
        first set they do not prove (the fixed model loads on its own meanwhile, its loadability
        checked)."""
        if self.fpart is None and self.feeds and any(b.inputs for b in self.boundaries):
            return _WholeRun.build(self.fixed, self.boundaries, self.extra,
                                   set(self.feeds[0]) | set(self.names) | set(self.extra) | set(self.capture),
                                   self.in_changes)
        return None

    def _load_fixed(self):
        sess, first = _fixed_session(self.early if self.early is not None
                                     else _begin_fixed(self.fixed, self.extra, self.keep_fixed, self.facts.f.names))
        self.early = None
        if sess is not None:
            return sess, None
        check = OutputCheck("<model>", False, float("inf"), 0.0, float("-inf"), 0.0, None,
                            f"the rewritten model does not load in onnxruntime: {first}")
        return None, self._failed([check])

    def _fixed_ready(self) -> Verification | None:
        """Wait for the fixed model's session (or the whole run's): the failed verdict where it does
        not load or lacks an output the original has, else None."""
        if self.whole is not None:
            self.s_fix = self.whole.sess
        else:
            self.s_fix, failed = self._load_fixed()
            if failed is not None:
                return failed
        fixed_names = {o.name for o in self.s_fix.get_outputs()}
        missing = [n for n in self.names if n not in fixed_names]
        if missing:
            checks = [OutputCheck(n, False, float("inf"), 0.0, float("-inf"), 0.0, None,
                                  "output missing from the fixed model") for n in missing]
            return self._failed(checks)
        self.fixed_inputs = {i.name for i in self.s_fix.get_inputs()}
        return None

    # -- run --------------------------------------------------------------------------------------

    def _run_original(self, feed, more):
        kept = self.kept
        ref = self.original_run(feed, kept + more) if self.original_run is not None else None
        if ref is not None:
            return ref, {**dict(feed), **dict(zip(kept + more, ref))}
        try:
            ref = self.s_orig.run(kept + more, dict(feed))
        except Exception as exc:  # noqa: BLE001 - e.g. a dynamic dimension the gate had to guess
            raise original_failed(exc, self.s_orig) from None
        return ref, {**dict(feed), **dict(zip(kept + more, ref))}

    def run(self) -> Verification | None:
        """Both models on every input set: the values of each output and boundary tensor gathered."""
        names, extra, front, rcap = self.names, self.extra, self.front, self.rcap
        in_changes, out_changes = self.in_changes, self.out_changes
        self.lsb = _output_scales(self.original)
        acc = self.acc = {n: [] for n in names + extra}
        captured = self.captured = []
        self.prun = (_PartRun(self.fpart, self.fixed, self.boundaries, in_changes, names + extra)
                     if self.fpart is not None else None)
        self.rrun = _RewrittenRun(self.rpart) if self.rpart is not None else None
        rproven = False  # the rewritten nodes computed the original's values on an input set already
        self.part_runs = 0  # input sets the part ran on (its isolated regions count only if it ran on all)
        kept = self.kept = names + extra + self.capture

        for feed in self.feeds:
            # the frontier only where the part may run on this input set: with the rewritten nodes'
            # tensors until they computed the original's values once (an input set they get wrong
            # after that runs the original again, for the frontier)
            if self.rrun is None:
                more = list(front)
            else:
                more = list(rcap) + ([] if rproven else [t for t in front if t not in rcap])
            try:
                ref, vals = self._run_original(feed, more)
            except Exception:
                if self.s_fix is None and (failed := self._fixed_ready()) is not None:
                    return failed  # (as when the fixed model was waited for before any run)
                raise
            if self.rrun is not None:
                try:
                    proven = self.rrun.proven(vals)
                except Exception:  # noqa: BLE001 - the rewritten nodes do not run on their own
                    proven = False
                if proven:
                    # every tensor of the fixed model is the original's on this input set
                    rproven = True
                    captured.append({k: vals[k] for k in list(feed) + kept})
                    for n, r in zip(names + extra, ref):
                        acc[n].append((np.asarray(r), np.asarray(r)))
                    continue
                self.rrun = None  # they differ here: the part (or the whole model) runs from this input set on
                if self.s_fix is None and (failed := self._fixed_ready()) is not None:
                    return failed
                if any(t not in vals for t in front):
                    ref, vals = self._run_original(feed, list(front))
                self.whole = self._build_whole()
                if self.whole is not None:
                    self.s_fix = self.whole.sess
            captured.append({k: vals[k] for k in list(feed) + kept + front})
            ffeed = {}
            for k, v in feed.items():
                if k not in self.fixed_inputs:
                    continue
                ch = in_changes.get(k)
                ffeed[k] = _edge_in(v, ch) if ch else v
            got = None
            if self.prun is not None:
                try:
                    got = self.prun.run(ffeed, captured[-1])
                    self.part_runs += 1
                except Exception:  # noqa: BLE001 - the part does not run on its own: the whole model runs
                    self.prun = None
            if got is None and self.whole is not None:
                try:
                    got = self.whole.run(names + extra, ffeed, captured[-1])
                # maybe a region: the fixed model alone from here on, the regions apart
                except Exception:  # noqa: BLE001
                    self.whole = None
                    self.s_fix, failed = self._load_fixed()
                    if failed is not None:
                        return failed
            try:
                if got is None:
                    got = self.s_fix.run(names + extra, ffeed)
            except Exception as exc:  # noqa: BLE001 - a rewrite onnxruntime cannot run fails the gate, not nafix
                first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:300]
                check = OutputCheck("<model>", False, float("inf"), 0.0, float("-inf"), 0.0, None,
                                    f"the rewritten model fails in onnxruntime: {first}")
                return self._failed([check])
            for n, r, g in zip(names + extra, ref, got):
                ch = out_changes.get(n)
                if ch is not None:
                    g = _edge_out(g, ch)
                elif n in extra:
                    r = _as_int8_if_shifted(r, np.asarray(g).dtype.type)
                acc[n].append((np.asarray(r), np.asarray(g)))

        if self.s_fix is None and (failed := self._fixed_ready()) is not None:
            return failed  # the rewritten nodes proved every input set: the fixed model must still load
        return None

    # -- judge ------------------------------------------------------------------------------------

    def _flat(self, n):
        acc = self.acc
        a = np.concatenate([r.reshape(-1) for r, _ in acc[n]]) if acc[n] else np.zeros(0)
        b = np.concatenate([g.reshape(-1) for _, g in acc[n]]) if acc[n] else np.zeros(0)
        return a, b

    def judge(self) -> Verification:
        """Every rewritten node under its rule's contract, every graph output under the model's; an
        output a rewritten node's LSB differences reach is judged against the noise floor."""
        original, contract, boundaries, feeds = self.original, self.contract, self.boundaries, self.feeds
        names, acc, captured, out_changes, lsb, seed = (self.names, self.acc, self.captured, self.out_changes,
                                                        self.lsb, self.seed)
        prun, whole, rrun, cut = self.prun, self.whole, self.rrun, self.cut
        bchecks = []
        rates: dict[str, float] = {}  # boundary tensor -> fraction of values the rewrite changed there
        isolated = prun.isolated() if prun is not None and self.part_runs == len(feeds) else None
        if isolated is None and whole is not None and whole.runs == len(feeds):
            isolated = whole.isolated()
        if isolated is None and rrun is not None and feeds:
            # the rewritten nodes computed the original's values on every input set: so does every
            # isolated region (its nodes fed the original's values), the figures of the tensors themselves
            isolated = {}
        if isolated is None:
            isolated = _isolated_boundaries(self.fixed, boundaries, captured, self.in_changes)
        for bc in boundaries:
            a, b = isolated.get(bc.tensor) or self._flat(bc.tensor)
            integer = a.dtype.kind in "iu"
            chk = compare(a, b, bc.contract, lsb_scale=1.0 if integer else None)
            bchecks.append(OutputCheck(f"{bc.tensor} ({bc.rule})", chk.ok, chk.max_abs_error, chk.cosine, chk.snr_db,
                                       chk.bit_exact_fraction, chk.within_one_lsb_fraction, chk.detail))
            if integer and bc.contract.contract == "lsb" and bc.contract.lsb > 0:
                rates[bc.tensor] = max(rates.get(bc.tensor, 0.0), 1.0 - chk.bit_exact_fraction)
        propagated = any(b.contract.contract == "lsb" and b.contract.lsb > 0 for b in boundaries)
        checks = []
        pending = []
        for n in names:
            a, b = self._flat(n)
            if contract.contract == "ranking":
                a = np.stack([r for r, _ in acc[n]])
                b = np.stack([g for _, g in acc[n]])
            scale = lsb.get(n) or (_scalar(out_changes[n].scale) if n in out_changes else None)
            chk = compare(a, b, contract, lsb_scale=scale)
            checks.append(OutputCheck(n, chk.ok, chk.max_abs_error, chk.cosine, chk.snr_db, chk.bit_exact_fraction,
                                      chk.within_one_lsb_fraction, chk.detail))
            if propagated and not chk.ok and contract.contract == "lsb":
                pending.append((len(checks) - 1, n, scale))
        if pending:
            floor = None
            if any(r > 0 for r in rates.values()):
                try:
                    floor = noise_floor(original, {t: r for t, r in rates.items() if r > 0}, feeds,
                                        {n: [r for r, _ in acc[n]] for _, n, _ in pending},
                                        {t: captured[0][t] for t in rates}, seed=seed,
                                        below=(cut, captured) if cut is not None else None)
                except Exception:  # noqa: BLE001 - e.g. a model onnxruntime cannot run with the injection
                    floor = None
            for i, n, scale in pending:
                old = checks[i]
                dev = output_deviation([r for r, _ in acc[n]], [g for _, g in acc[n]], scale)
                if floor is not None and n in floor:
                    ok, text = judge_against_floor(dev, floor[n])
                    detail = f"{old.detail}; differences from the rewritten nodes propagate here: {text}"
                    nf = {"rewrite": dev.as_dict(), "floor": floor[n].as_dict(), "accepted": ok}
                else:
                    ok = old.cosine >= PROPAGATED_MIN_COSINE
                    detail = (f"{old.detail}; differences from the rewritten nodes propagate here: "
                              f"cosine {old.cosine:.6f} "
                              f"({'accepted' if ok else 'rejected'}: no noise floor could be measured, needs cosine >= "
                              f"{PROPAGATED_MIN_COSINE})")
                    nf = None
                checks[i] = OutputCheck(n, ok, old.max_abs_error, old.cosine, old.snr_db, old.bit_exact_fraction,
                                        old.within_one_lsb_fraction, detail, nf)
        ok = all(c.ok for c in checks) and all(c.ok for c in bchecks)
        caution = None
        if ok and self.src == "random":
            moves = large_moves(checks, acc)
            caution = caution_text(moves, len(feeds)) if moves else None
        return Verification(ok, contract, list(self.rules), checks, self.src, len(feeds), bchecks, propagated, caution)
