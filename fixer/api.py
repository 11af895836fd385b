"""The nafix library API: no printing, no exiting; options in, dataclasses out."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .analysis import analyze_model
from .errors import InputError, NafixError, UsageError
from .graph import gc_paused, relaxed_gc
from .importers import check_loaded
from .model_io import LoadedModel, invalid_model_error, load_model
from .npu.placement import is_oe_export
from .npu.profile import TargetProfile, load_profile
from .quantize import CalibrationOptions, open_calibration
from .report_data import fix_dict, fix_header
from .results import (  # noqa: F401  (re-exported: fixer.api is where callers found them)
    AuditResult, CompileComparison, CompiledModel, FixResult, ModelAnalysis, ModelAudit,
)

from .options import (  # noqa: F401  (re-exported: light, see fixer.options)
    MODEL_SUFFIXES, AnalysisOptions, AuditOptions, collect_models, resolve_pools, resolve_profile,
)

if TYPE_CHECKING:
    from .stedgeai.compare import CompileOptions

log = logging.getLogger(__name__)

ONNX_SUFFIXES = (".onnx",)


def analyze_path(path: str | os.PathLike[str], opts: AnalysisOptions, *, profile: TargetProfile | None = None,
                 pools=None) -> ModelAnalysis:
    profile = profile or resolve_profile(opts)
    max_opset = None
    loaded = load_model(path, input_shapes=opts.input_shapes, max_opset=max_opset)
    check_loaded(loaded)
    return analyze_model(loaded, profile=profile, pools=pools)


@relaxed_gc  # large graphs: fewer garbage-collector passes (fixer.graph.RELAXED_GC_THRESHOLDS)
def audit(paths: Sequence[str | os.PathLike[str]], opts: AuditOptions = AuditOptions(), *,
          progress: Callable[[int, int, Path], None] | None = None) -> AuditResult:
    """Audit every model under ``paths``; an unreadable model becomes an error row, not an abort."""
    if not paths:
        raise UsageError("give at least one model file or folder to audit.")
    profile = resolve_profile(opts.analysis)
    pools = resolve_pools(opts.analysis)
    files = collect_models(paths, recursive=opts.recursive)
    if not files:
        raise InputError(f"no .onnx or .tflite model found under {', '.join(str(p) for p in paths)}.")
    rows: list[ModelAudit] = []
    # every path given gets a row: a folder without any model is an error row of its own
    for p in paths:
        if Path(p).is_dir() and not collect_models([p], recursive=opts.recursive):
            rows.append(ModelAudit(Path(p), error=f"{p}: no .onnx model found in this folder."))
    for i, f in enumerate(files):
        if progress:
            progress(i, len(files), f)
        rows.append(audit_model(f, opts.analysis, profile=profile, pools=pools))
    if progress:
        progress(len(files), len(files), files[-1])
    return AuditResult(rows)


def audit_error(path: str | os.PathLike[str], exc: BaseException) -> str:
    """The error of a model audit could not analyse, as its row says it (the one wording of
    :func:`audit` and the zoo workers)."""
    if isinstance(exc, NafixError):
        return exc.message
    if isinstance(exc, MemoryError):
        return f"{path}: nafix ran out of memory analysing this model."
    invalid = invalid_model_error(Path(path), exc)
    return invalid.message if invalid else \
        f"{path}: nafix could not analyse this model ({type(exc).__name__}: {exc})."


def audit_model(path: str | os.PathLike[str], opts: AnalysisOptions, *, profile: TargetProfile,
                pools=None) -> ModelAudit:
    """One model of an audit (:func:`audit` and the zoo workers): its analysis, released, with what
    ``--quantize`` is estimated to remove; or, whatever went wrong, its error (an unreadable model
    becomes an error row, not an abort)."""
    from .quantize.gain import quantize_gain

    try:
        analysis = analyze_path(path, opts, profile=profile, pools=pools)
        gain = quantize_gain(analysis, pools=pools)
        return ModelAudit(Path(path), analysis=analysis.released(), quantize=gain)
    except Exception as exc:  # noqa: BLE001 - one broken model must not abort a zoo audit
        if not isinstance(exc, NafixError):
            log.debug("unexpected error on %s", path, exc_info=True)
        return ModelAudit(Path(path), error=audit_error(path, exc))


# ------------------------------------------------------------------------------------------------
# nafix fix
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixOptions:
    """Options of ``nafix fix`` (and ``nafix MODEL``)."""

    analysis: AnalysisOptions = AnalysisOptions()
    output: str | None = None  # default: <model>.nafix.onnx beside the input
    dry_run: bool = False
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()  # rules added to the default set (or to --select's)
    rules_dirs: tuple[str, ...] = ()
    input_type: str = "int8"  # int8 | uint8 (camera frames) for a quantized graph input
    inputs_npz: str | None = None
    keep_failed: bool = False
    force: bool = False  # overwrite an existing output that nafix did not write
    seed: int = 0
    samples: int = 3
    max_rounds: int = 8
    compile: "CompileOptions | None" = None  # measure before/after with the real stedgeai
    quantize: bool = False  # re-quantize with onnxruntime (float in, NPU-ready int8 out)
    calib: CalibrationOptions | None = None  # where calibration data comes from (None: random)
    annotate: bool = True  # nafix.placement / nafix.reason in each written node's metadata_props (Netron)
    #: --quantize fails (exit 1, nothing written unless keep_failed) when an output's cosine against the
    #: original is below this (fixer.quantize.flow.QUANT_FAIL_COSINE by default; 0 turns it off)
    min_cosine: float | None = None


def default_outputs(model_path: Path, output: str | None) -> tuple[Path, Path, Path]:
    """(model, JSON report, C header) paths: ``model.nafix.onnx`` etc. beside the input, or from -o
    (a folder, i.e. a trailing separator or an existing folder, gets ``model.nafix.onnx`` inside)."""
    from .outputs import resolve_output

    out = resolve_output(output, model_path.stem + ".nafix.onnx", default_dir=model_path.parent)
    stem = out.name[:-5] if out.name.endswith(".onnx") else out.name
    return out, out.with_name(stem + ".json"), out.with_name(stem + ".h")


def _fix_inputs(opts: FixOptions, src: Path) -> tuple[Path, ...]:
    """The files a fix run reads: never written over, even with --force."""
    paths = [src]
    if opts.inputs_npz:
        paths.append(Path(opts.inputs_npz))
    if opts.calib is not None and getattr(opts.calib, "path", None):
        paths.append(Path(opts.calib.path))
    return tuple(paths)


def _check_user_files(opts: FixOptions, loaded: LoadedModel) -> None:
    """Check the data files the user named against the model, before any work: the ``--inputs`` .npz
    (array names, shapes and dtypes), the ``--calib`` data (its structure and first sample). The
    target profile and the rule folders are read (and checked) by their own loaders first."""
    from .gate import check_inputs_npz

    if opts.inputs_npz:
        check_inputs_npz(opts.inputs_npz, loaded.model)
    if opts.quantize and opts.calib is not None and getattr(opts.calib, "path", None):
        open_calibration(loaded.model, opts.calib, model_name=loaded.path.name)


def _check_fix_outputs(opts: FixOptions, src: Path, out: Path, report: Path, header: Path | None = None) -> None:
    """Refuse, before any work, an output that would replace an input or a file nafix did not write."""
    from .outputs import MODEL, REPORT, check_output

    protect = _fix_inputs(opts, src)
    check_output(out, kind=MODEL, force=opts.force, protected=protect, what="model")
    check_output(report, kind=REPORT, force=opts.force, protected=protect, what="JSON report")
    if header is not None:
        check_output(header, kind=REPORT, force=opts.force, protected=protect, what="C header")


@relaxed_gc  # large graphs: fewer garbage-collector passes (fixer.graph.RELAXED_GC_THRESHOLDS)
def fix(path: str | os.PathLike[str], opts: FixOptions = FixOptions(), *,
        on_round: Callable[[int, int], None] | None = None,
        on_compile_line: Callable[[str, str], None] | None = None,
        on_calibration: Callable[[int, int], None] | None = None) -> FixResult:
    """Rewrite NPU-unfriendly patterns, verify equivalence, and (unless a dry run) write the results.

    Without --quantize the cyclic garbage collector is paused for the whole fix (restored after it,
    also on error): the fix builds graph views whose objects all survive it, and each collection
    walked them again (a 31k-node chain: ~0.5 s of collections). What a fix discards is collected
    when the collector next runs. --quantize keeps it running (onnxruntime's quantizer allocates
    much that it discards)."""
    if opts.quantize:
        return _fix(path, opts, on_round=on_round, on_compile_line=on_compile_line, on_calibration=on_calibration)
    with gc_paused():
        return _fix(path, opts, on_round=on_round, on_compile_line=on_compile_line, on_calibration=on_calibration)


def _fix(path: str | os.PathLike[str], opts: FixOptions, *, on_round, on_compile_line, on_calibration) -> FixResult:
    import onnx

    from . import __version__
    from .deadline import stage
    from .engine import run_engine
    from .outputs import save_model
    from .rules import load_rules, select_rules
    from .gate import boundary_checks, change_contracts, load_inputs_npz, loosest, verify
    from .quantize.flow import quantize_stage

    if opts.input_type not in ("int8", "uint8"):
        raise UsageError(f"--input-type must be int8 or uint8, not '{opts.input_type}'.")
    if opts.compile is not None:
        from .stedgeai.compare import check_compile_options

        check_compile_options(opts.compile)  # before any work: a bad --compile option fails at once
    profile = resolve_profile(opts.analysis)
    pools = resolve_pools(opts.analysis)
    src = Path(path)
    out, report_path, header_path = default_outputs(src, opts.output)
    loaded = load_model(src, input_shapes=opts.analysis.input_shapes)
    # every file the user named is read and checked before any work (a bad one fails even where
    # there turns out to be nothing to fix)
    _check_user_files(opts, loaded)
    rules = select_rules(load_rules(opts.rules_dirs), select=opts.select, ignore=opts.ignore,
                         extend=opts.extend_select)
    import_check = check_loaded(loaded, seed=opts.seed)
    if import_check is not None and not import_check.checked and not opts.dry_run:
        raise InputError(f"{src}: writing a model fixed from a TFLite file needs the TFLite interpreter to check "
                         "the import (pip install 'nafix[tflite]'); --dry-run analyses it without.")
    if not opts.dry_run:
        _check_fix_outputs(opts, src, out, report_path)
    before = analyze_model(loaded, profile=profile, pools=pools)
    warnings: list[str] = []
    advice: list[str] = []
    from .graph import is_quantized

    float_model = not opts.quantize and not is_quantized(loaded.model)
    reference = loaded.model  # what the rule rewrites are verified against
    pre_engine = None
    quant_info = None
    if opts.quantize and is_oe_export(loaded.model):
        warnings.append("--quantize skipped: this is ST's own export (producer Cube.AI, *_OE_*), already "
                        "quantized by ST's front end with its parameters in a side _Q.json")
    elif opts.quantize:
        from .shapes import refresh_shapes

        def calibrated(done: int, total: int) -> None:  # each sample is a stage of its own (--timeout)
            stage(f"quantization (onnxruntime calibration, after sample {done} of {total})")
            if on_calibration is not None:
                on_calibration(done, total)

        stage("quantization (onnxruntime)")
        reference, pre_engine, quant_info = quantize_stage(loaded, opts, profile, warnings, on_round, calibrated)
        reference = refresh_shapes(reference)  # types and shapes of the tensors quantization added
    # the analysis before placed this very model: the engine starts from its graph view (which it
    # edits: the analysis keeps its figures, not the view), placement and estimate
    start = (before.view, before.placement, before.estimate) if reference is loaded.model else None
    if start is not None:
        from dataclasses import replace

        before = replace(before, view=None)
    stage("rewriting")
    engine = run_engine(reference, rules, profile=profile, options={"input_type": opts.input_type},
                        max_rounds=opts.max_rounds, on_round=on_round, start=start, pools=pools)
    rules_by_id = {r.id: r for r in rules}
    verification = None
    after = None
    if engine.changes:
        contracts = change_contracts(engine, rules_by_id)
        contract = loosest(list(contracts.values()))
        feeds = load_inputs_npz(opts.inputs_npz, reference) if opts.inputs_npz else None
        stage("verification (onnxruntime)")
        verification = verify(reference, engine.model, contract=contract, rules=engine.rules_applied,
                              io_changes=engine.io_changes, inputs=feeds, seed=opts.seed, samples=opts.samples,
                              boundaries=boundary_checks(engine, contracts))
    static_shape = None
    if _user_pins(loaded, opts):
        stage("verification of the static input shape (onnxruntime)")
        static_shape, shape_check = _static_shape_check(src, loaded, opts)
        if verification is None or not shape_check.ok:
            verification = shape_check  # a failed check is the run's verdict: nothing written
    if engine.changes or quant_info is not None:
        fixed_loaded = LoadedModel(path=out, model=engine.model, opset=loaded.opset,
                                   dynamic_dims=loaded.dynamic_dims)
        stage("analysis of the fixed model")
        after = analyze_model(fixed_loaded, profile=profile, pools=pools, placed=_engine_placed(engine))
        if after.estimate.hw_ratio < before.estimate.hw_ratio:
            warnings.append(
                f"the estimated HW ratio went down ({before.estimate.hw_ratio:.1%} -> {after.estimate.hw_ratio:.1%}); "
                "this is a nafix bug, please report it")
    regression, worse = _worse_than_input(src, before, after, engine, pre_engine, opts, warnings)
    accuracy_failure = _accuracy_failure(src, quant_info, opts)
    gain = None
    if not opts.quantize:
        from .quantize_advice import gain_advice
        from .quantize.gain import quantize_gain

        gain = quantize_gain(after if after is not None else before, pools=pools)
        advice.extend(gain_advice(before.estimate, gain, float_model=float_model))
    written = False
    verified = verification is None or verification.ok
    if (engine.changes or quant_info is not None or static_shape is not None) and not opts.dry_run \
            and (verified or opts.keep_failed) \
            and (regression is None or opts.keep_failed) and (accuracy_failure is None or opts.keep_failed):
        # every file this run will write is checked before the first one is written
        stage("writing the fixed model", timed=False)  # no foreign code: a write is never cut short
        _check_fix_outputs(opts, src, out, report_path, header_path if engine.io_changes else None)
        model = engine.model
        meta = {p.key: p.value for p in model.metadata_props}
        meta.update({
            "nafix.version": __version__,
            "nafix.rules": ",".join(engine.rules_applied),
            "nafix.profile": profile.name,
            "nafix.verified": "yes" if verified else "NO (written with --keep-failed)",
        })
        if regression is not None:
            meta["nafix.not_worse"] = f"NO (written with --keep-failed): {worse}"
        if accuracy_failure is not None:
            meta["nafix.accuracy"] = f"NO (written with --keep-failed): {accuracy_failure}"
        if quant_info is not None:
            meta["nafix.quantized"] = f"onnxruntime, calibration={quant_info.get('calibration')}"
        if static_shape is not None:
            meta["nafix.input_shape"] = ";".join(f"{k}={','.join(map(str, v))}" for k, v in static_shape["inputs"].items())

        del model.metadata_props[:]
        for k, v in meta.items():
            model.metadata_props.add(key=k, value=v)
        if opts.annotate:  # after the gate: metadata only, for the written model (Netron shows it)
            _annotate(model, after if after is not None else before)
        save_model(model, out, protect=_fix_inputs(opts, src), force=opts.force)
        written = True
    result = FixResult(
        input=src, output=out if written else None, report_path=None, header_path=None, before=before,
        after=after, engine=engine, verification=verification, written=written,
        rules_run=[r.id for r in rules], warnings=warnings, quantization=quant_info, pre_engine=pre_engine,
        advice=advice, regression=regression, accuracy_failure=accuracy_failure, dry_run=opts.dry_run,
        quantize_estimate=gain, static_shape=static_shape,
    )
    if loaded.imported is not None and engine.changes:
        stage("the check against the TFLite interpreter")
        result.source_check = _fixed_vs_source(loaded, engine, opts)
    stage("writing the reports", timed=False)
    if opts.compile is not None:
        stage("stedgeai (--compile-timeout)", timed=False)
        try:
            from .stedgeai.compare import compile_before_after

            result.compiled = compile_before_after(result, opts.compile, on_compile_line)
        except NafixError:
            if not opts.dry_run:  # the model is written: its report and header go with it
                _write_fix_reports(result, opts, header_path, report_path)
            raise
    if not opts.dry_run:
        _write_fix_reports(result, opts, header_path, report_path)
    return result


def _user_pins(loaded: LoadedModel, opts: FixOptions) -> list:
    """The graph-input dimensions ``--input-shape`` pinned (dynamic in the file, static in the model)."""
    return [d for d in loaded.dynamic_dims if d.pinned_to is not None and d.input in opts.analysis.input_shapes]


def _static_shape_check(src: Path, loaded: LoadedModel, opts: FixOptions):
    """The static input shape of ``--input-shape`` as a change of its own: the model with the pinned
    inputs (shapes inferred) against the file's dynamic model, bit for bit, on inputs of the pinned
    shape (the ``--inputs`` arrays when given, else seeded random ones). Returns (the report's
    ``static_shape`` dict, the verification)."""
    from .gate import VerifyContract, load_inputs_npz, make_inputs, verify

    original = load_model(src, assume_batch_one=False).model  # the file's own, dynamic, model
    pinned = loaded.model
    feeds = (load_inputs_npz(opts.inputs_npz, pinned) if opts.inputs_npz
             else make_inputs(pinned, seed=opts.seed, samples=opts.samples))
    v = verify(original, pinned, contract=VerifyContract("exact"), rules=["static input shape (--input-shape)"],
               inputs=feeds, seed=opts.seed, samples=opts.samples)
    if not opts.inputs_npz:
        v.inputs = "random"  # seeded random inputs of the pinned shape (the gate made none of its own)
    pins = _user_pins(loaded, opts)
    names = list(dict.fromkeys(d.input for d in pins))
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in pinned.graph.input
              if vi.name in names}
    return {"inputs": shapes, "pinned": [d.describe() for d in pins], "verification": v.as_dict()}, v


def _worse_than_input(src: Path, before: ModelAnalysis, after: ModelAnalysis | None, engine, pre_engine,
                      opts: FixOptions, warnings: list[str]) -> tuple[str | None, str | None]:
    """The never-worse promise for the whole run (the --quantize stage, its rewrites and every rule
    round) against the model the user gave: (one sentence, what got worse) when the fixed model's
    estimate is worse than the input's (:func:`fixer.engine.worse_than_input`, the engine guard's
    test), else (None, None).
    A run in which a rule that fixes a compile error or a board hang changed the model is exempt,
    as it is from the engine's guard; the worse estimate is then a warning."""
    from .engine import guard_exempt, worse_than_input
    from .rules import load_rules

    if after is None:
        return None, None
    what = worse_than_input(before.estimate, after.estimate)
    if what is None:
        return None, None
    applied = {c.rule for c in engine.changes} | ({c.rule for c in pre_engine.changes} if pre_engine else set())
    exempt = sorted(r.id for r in load_rules(opts.rules_dirs) if r.id in applied and guard_exempt(r))
    if exempt:
        warnings.append(f"the fixed model is estimated worse than the input ({what}), kept because rule(s) "
                        f"{', '.join(exempt)} fix a compile error or a board hang")
        return None, None
    stage = "quantization and the rules" if opts.quantize else "the rules"
    sentence = (f"{src}: the model after {stage} is estimated worse than the input ({what}); nafix never makes "
                f"a model worse")
    if opts.keep_failed and not opts.dry_run:
        sentence += ", written anyway with --keep-failed and marked nafix.not_worse=NO"
        warnings.append(sentence)  # the JSON report written beside the model records it
    else:
        sentence += ", nothing written" + ("" if opts.dry_run else " (--keep-failed writes it anyway)")
    return sentence + ".", what


def _annotate(model, analysis: ModelAnalysis) -> None:
    """Each node's estimated placement and its reason into its ``metadata_props``
    (:func:`fixer.node_info.annotate_model`), from the analysis of this very model."""
    from .graph import GraphView
    from .node_info import annotate_model, view_node_names
    from .report_data import analysis_dict

    view = analysis.view if analysis.view is not None and analysis.view.graph is not None else GraphView(model)
    annotate_model(model, analysis_dict(analysis), view_node_names(view))


def _accuracy_failure(src: Path, quant_info: dict | None, opts: FixOptions) -> str | None:
    """--quantize: a sentence when some output of the quantized model has a cosine against the original
    below ``opts.min_cosine`` (the model is then not written unless --keep-failed), else None."""
    from .quantize.flow import QUANT_FAIL_COSINE

    if quant_info is None:
        return None
    limit = QUANT_FAIL_COSINE if opts.min_cosine is None else opts.min_cosine
    low = [o for o in quant_info.get("outputs", []) if o.get("cosine") is not None and o["cosine"] < limit]
    if not low:
        return None
    figures = ", ".join(f"'{o['name']}' {o['cosine']:.4f}" for o in low[:3]) + (", ..." if len(low) > 3 else "")
    return (f"{src}: the quantized model's output cosine against the original is below --min-cosine {limit:g} "
            f"({figures}, on {quant_info.get('accuracy_samples') or 'the'} {quant_info.get('calibration', '')} "
            f"sample(s)); check the calibration data (--calib)")


def _engine_placed(engine) -> tuple | None:
    """The engine's own graph view (where no rewriter touched it), placement and estimate of the
    model it returns, where marking the nodes it created cannot have changed them (a created
    Transpose could lose the TFLite layout mark that placement reads): the analysis after the fix
    does not import and place the same model again."""
    if engine.placement is None or engine.estimate is None:
        return None
    if any(n.op_type == "Transpose" and n.name in engine.provenance for n in engine.model.graph.node):
        return None
    return engine.view, engine.placement, engine.estimate


def _write_fix_reports(result: FixResult, opts: FixOptions, header_path: Path, report_path: Path) -> None:
    """The C header (when interface edges became integer) and the JSON report beside the model."""
    from .json_schema import dumps
    from .outputs import atomic_write_text

    protect = _fix_inputs(opts, result.input)
    if result.written and result.engine.io_changes:
        atomic_write_text(header_path, fix_header(result, header_path), force=opts.force, protect=protect)
        result.header_path = header_path
    if result.written or not result.changed:
        result.report_path = report_path
        atomic_write_text(report_path, dumps(fix_dict(result), indent=2) + "\n", force=opts.force,
                          protect=protect)


def _fixed_vs_source(loaded: LoadedModel, engine, opts: FixOptions) -> list | None:
    """The fixed model against the original's own runtime (the TFLite interpreter), same seeded inputs."""
    from .importers.tflite_check import compare_model

    return compare_model(loaded.imported, engine.model, io_changes=engine.io_changes, seed=opts.seed)
