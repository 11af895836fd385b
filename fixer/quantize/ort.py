"""The onnxruntime ``quantize_static`` wrapper: the ST recipe, the NPU op types onnxruntime leaves in
float by default, and :func:`quantize_float_model`.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto

from .. import ir
from ..errors import InputError, NafixError, UsageError
from .calibration import CalibrationOptions, Progress, _reader, open_calibration
from .checks import check_npu_quantization, float_islands
from .ort_linear import linear_time_quantization
from .modelproto import (
    _attr,
    _clamp_ir,
    _copy,
    _drop_ort_metadata,
    _drop_unused_initializers,
    _is_quantized,
    _load_profile,
    _quiet_onnxruntime,
    _strip_initializer_inputs,
    _unique_names,
)

log = logging.getLogger(__name__)

#: The NPU's scheme as onnxruntime ``quantize_static`` arguments (NPU_FACTS.md#quantization, 3P recipe).
ST_RECIPE_TEXT = ("QDQ, activation_type=QInt8, weight_type=QInt8, per_channel=True, "
                  "ActivationSymmetric=False, WeightSymmetric=True")

#: Per-axis QuantizeLinear/DequantizeLinear (per-channel weights) exist from this opset on.
MIN_PER_CHANNEL_OPSET = 13


def ort_default_op_types() -> frozenset[str]:
    """The op types ``quantize_static`` quantizes when ``op_types_to_quantize`` is not given."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return frozenset(QDQRegistry) | frozenset(QLinearOpsRegistry)


def npu_op_types(profile=None) -> tuple[list[str], list[str]]:
    """(op types to pass to ``op_types_to_quantize``, the NPU ops among them onnxruntime would skip).

    onnxruntime quantizes only the ops in its registries by default; every op the target profile
    runs on the NPU (tier ``hw``) or with an int8 SW kernel that is missing there (PRelu, Tanh,
    HardSwish, Sub, Max, Min, Div, GlobalMaxPool, ReduceMean, ReduceMax, DepthToSpace, ... with the
    default profile) is added, so it gets QuantizeLinear/DequantizeLinear on all its inputs and
    outputs (onnxruntime's generic QDQ handling) instead of staying a float island.
    """
    profile = _load_profile(profile)
    default = ort_default_op_types()
    wanted = {op for op, r in profile.operators.items() if r.tier == "hw"} | set(profile.sw_int8_kernels)
    # Integer-only ops are already quantized; Upsample is deprecated (Resize replaces it).
    wanted = {op for op in wanted if not op.startswith("QLinear") and op not in ("ConvInteger", "MatMulInteger", "Upsample")}
    added = sorted(wanted - default)
    return sorted(default | wanted), added


def _prelu_slope_overrides(model: onnx.ModelProto, names: set[str] | None = None) -> dict[str, list[dict]]:
    """TensorQuantOverrides making float PRelu slopes int8 symmetric (per channel when they have
    channels and the opset has per-axis DequantizeLinear)."""
    inits = {t.name: t for t in model.graph.initializer}
    per_channel = ir.model_opset(model) >= MIN_PER_CHANNEL_OPSET
    out: dict[str, list[dict]] = {}
    for n in model.graph.node:
        if n.op_type != "PRelu" or len(n.input) < 2 or (names is not None and n.name not in names):
            continue
        t = inits.get(n.input[1])
        if t is None or t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
            continue
        dims = list(t.dims)
        if dims and dims[0] > 1 and per_channel:
            out[t.name] = [{"axis": 0, "symmetric": True}]
        else:
            out[t.name] = [{"symmetric": True}]
    return out


def _grouped_conv_transpose_overrides(model: onnx.ModelProto, names: set[str] | None = None) -> dict[str, list[dict]]:
    """TensorQuantOverrides for grouped ConvTranspose weights, which onnxruntime's per-channel path
    gets wrong (its axis-1 scales do not match the bias): depthwise ones (one output channel per
    group) per channel along axis 0, which is then the output channel; other grouped ones per tensor,
    symmetric."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, list[dict]] = {}
    for n in model.graph.node:
        if n.op_type != "ConvTranspose" or int(_attr(n, "group", 1)) == 1 or (names is not None and n.name not in names):
            continue
        w = inits.get(n.input[1]) if len(n.input) > 1 else None
        if w is None or w.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16) or len(w.dims) < 2:
            continue
        if w.dims[1] == 1 and ir.model_opset(model) >= MIN_PER_CHANNEL_OPSET:
            out[w.name] = [{"axis": 0, "symmetric": True}]
        else:
            out[w.name] = [{"symmetric": True}]
    return out


def _calibration_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


def _merge_every(reader, batch: int = 16) -> int:
    """Samples per range merge. onnxruntime fails with 'No data is collected' when the sample count is
    a multiple of this batch (its last merge is empty), so pick a batch that does not divide it."""
    try:
        total = len(reader)
    except TypeError:
        return batch
    while total > 0 and total % batch == 0 and batch < total:
        batch += 1
    return max(batch, 1) if total == 0 or total % batch else total + 1


class _RecordingSession:
    """onnxruntime's calibration session, recording the graph outputs of its first ``keep`` runs.

    onnxruntime's calibrators run the float model (augmented with their range-collecting outputs)
    once per calibration sample, and the augmented model still computes the original graph outputs:
    these are the float model's outputs on the calibration samples, which the accuracy report
    compares the quantized model against. Recording them spares a second float session over the
    same samples. Nothing the calibrator sees changes: ``run`` returns the same values.
    """

    def __init__(self, inner, names: Sequence[str], keep: int, sink: list):
        self._inner = inner
        self._names = list(names)
        self._keep = keep
        self._sink = sink

    def run(self, output_names, input_feed, run_options=None):
        values = self._inner.run(output_names, input_feed, run_options)
        if len(self._sink) < self._keep:
            fetched = list(output_names) if output_names else [o.name for o in self._inner.get_outputs()]
            where = {n: i for i, n in enumerate(fetched)}
            if all(n in where for n in self._names):
                # copies: an array onnxruntime returns may keep the session's memory arena alive
                self._sink.append((dict(input_feed), {n: np.array(values[where[n]], copy=True) for n in self._names}))
        return values

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextlib.contextmanager
def _wrapped_calibration_session(wrap) -> Iterator[None]:
    """Within the block, the session onnxruntime's calibrators make (their own
    ``create_inference_session``, as patched by any enclosing block) is ``wrap(session)``."""
    from onnxruntime.quantization import calibrate

    original = calibrate.CalibraterBase.__dict__["create_inference_session"]

    def create_inference_session(self):
        original(self)
        self.infer_session = wrap(self.infer_session)

    calibrate.CalibraterBase.create_inference_session = create_inference_session
    try:
        yield
    finally:
        calibrate.CalibraterBase.create_inference_session = original


@contextlib.contextmanager
def _recording_calibration(names: Sequence[str], keep: int, sink: list) -> Iterator[None]:
    """Within the block, onnxruntime's calibrators record the graph outputs ``names`` of their first
    ``keep`` samples into ``sink`` as ``(feed, {name: value})`` (see :class:`_RecordingSession`)."""
    if keep <= 0:
        yield
        return
    with _wrapped_calibration_session(lambda session: _RecordingSession(session, names, keep, sink)):
        yield


class _NoSpinOnnxruntime:
    """``onnxruntime`` as onnxruntime's calibrator module sees it while it creates its session,
    except that ``SessionOptions()`` come with idle worker threads sleeping instead of spinning."""

    def __init__(self, ort):
        self._ort = ort

    def __getattr__(self, name):
        return getattr(self._ort, name)

    def SessionOptions(self):  # noqa: N802 - onnxruntime's name
        opts = self._ort.SessionOptions()
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return opts


@contextlib.contextmanager
def _calibration_without_spinning() -> Iterator[None]:
    """Within the block, onnxruntime's calibrators create their session (its own
    ``create_inference_session``: its options, its providers) with idle worker threads sleeping
    instead of spinning between the parallel parts of a run. Scheduling only: the same kernels
    compute the same ranges, and the quantized model is byte for byte the same. On a loaded 2-core
    machine the spinning cost ~50% more CPU time over the 16 calibration runs of a YOLOv8n."""
    from onnxruntime.quantization import calibrate

    original = calibrate.CalibraterBase.__dict__["create_inference_session"]

    def create_inference_session(self):
        module = calibrate.onnxruntime
        calibrate.onnxruntime = _NoSpinOnnxruntime(module)
        try:
            original(self)
        finally:
            calibrate.onnxruntime = module

    calibrate.CalibraterBase.create_inference_session = create_inference_session
    try:
        yield
    finally:
        calibrate.CalibraterBase.create_inference_session = original


#: Whether onnxruntime's calibration reads the next sample while the current one runs
#: (:func:`_calibration_reading_ahead`).
READ_AHEAD = True


class _ReadAhead:
    """The calibration's samples read one ahead (:func:`_calibration_reading_ahead`): :meth:`get_next`
    hands the calibrator the next sample of ``source`` (a CalibrationDataReader) with its run begun on
    a thread of its own, then reads the sample after it while that run goes on; ``wrap(session)``
    gives the calibrator a session whose ``run(None, sample)`` of a sample so handed out waits for
    that run. One run at a time, in the calibrator's order."""

    def __init__(self, source):
        import concurrent.futures

        self.source = source
        self.session = None  # the calibrator's session, once made
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nafix-calibration")
        self.ahead: tuple | None = None  # (sample, run) read, not handed out yet; (error, None): a failed read
        self.handed: tuple | None = None  # (sample, run) handed out last, not run by the calibrator yet
        self.exhausted = False

    def wrap(self, session):
        self.session = session
        return _ReadAheadSession(session, self)

    def _read(self) -> None:
        """Read the next sample into :attr:`ahead`, its run queued (a failed read is raised when the
        calibrator asks for that sample)."""
        try:
            sample = self.source.get_next()
        except Exception as exc:  # noqa: BLE001 - raised when the calibrator asks for that sample
            self.exhausted = True
            self.ahead = (exc, None)
            return
        if not sample:  # (onnxruntime's own test for the end)
            self.exhausted = True
            return
        self.ahead = (sample, self.pool.submit(self.session.run, None, sample))

    def get_next(self):
        if self.session is None:  # (no session yet: nothing to run it in)
            return self.source.get_next()
        if self.ahead is None and not self.exhausted:
            self._read()
        if self.ahead is None:
            return None
        sample, run = self.ahead
        self.ahead = None
        if run is None:
            raise sample
        self.handed = (sample, run)
        if not self.exhausted:
            self._read()  # the next sample, while this one runs
        return sample

    def result(self, output_names, input_feed, run_options):
        """The run begun for ``input_feed`` when it is a sample handed out and the call is the one
        begun (every output, no run options), else None."""
        if output_names is not None or run_options is not None:
            return None
        if self.handed is None or self.handed[0] is not input_feed:
            return None
        run, self.handed = self.handed[1], None
        return run

    def close(self) -> None:
        """Cancel the runs not begun, wait for the one going (nothing is left running)."""
        self.ahead = self.handed = None
        self.pool.shutdown(wait=True, cancel_futures=True)


class _ReadAheadReader:
    """The CalibrationDataReader of a :class:`_ReadAhead` (the calibrator reads its samples here)."""

    def __init__(self, ahead: _ReadAhead):
        self._ahead = ahead

    def get_next(self):
        return self._ahead.get_next()

    def __iter__(self):
        return self

    def __next__(self):
        sample = self.get_next()
        if not sample:
            raise StopIteration
        return sample

    def __len__(self) -> int:
        return len(self._ahead.source)


class _ReadAheadSession:
    """The calibrator's session: ``run`` of a sample :class:`_ReadAhead` handed out waits for that
    sample's run; any other call runs as it would."""

    def __init__(self, inner, ahead: _ReadAhead):
        self._inner = inner
        self._ahead = ahead

    def run(self, output_names, input_feed, run_options=None):
        begun = self._ahead.result(output_names, input_feed, run_options)
        if begun is not None:
            return begun.result()
        return self._inner.run(output_names, input_feed, run_options)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextlib.contextmanager
def _calibration_reading_ahead(reader) -> Iterator[object]:
    """Yields the reader to hand onnxruntime's calibrator instead of ``reader``: within the block, the
    calibration session runs each sample on a thread of its own while the calibrator's thread reads
    the next one (random samples drawn, images decoded and resized, .npz arrays loaded).
    onnxruntime's calibrators (MinMax, Entropy, Percentile) read a sample, run it with every output
    and keep the result, one after the other: they get the same results in the same order, one run
    at a time in their own session, so the ranges and the quantized model are byte for byte the
    same (tests/test_calibration_pipeline.py). With :data:`READ_AHEAD` off the block changes nothing.

    Not two runs at a time: two runs in flight in the one session (the same bits) took a float
    YOLOv8n's quantization from 635 to 1041 MiB, and two one-thread sessions compute other bits
    (onnxruntime splits some kernels' sums by thread count: 2 of nafix's 5 float sample models'
    ranges moved by an ulp)."""
    if not READ_AHEAD:
        yield reader
        return
    ahead = _ReadAhead(reader)
    try:
        with _wrapped_calibration_session(ahead.wrap):
            yield _ReadAheadReader(ahead)
    finally:
        ahead.close()


def _run_quantize_static(model: onnx.ModelProto, reader, *, op_types: Sequence[str], method: str,
                         nodes_to_quantize: Sequence[str] = (), nodes_to_exclude: Sequence[str] = (),
                         overrides: Mapping[str, list[dict]] | None = None, keep_activations: bool = False,
                         model_name: str, record: tuple[int, list] | None = None) -> onnx.ModelProto:
    """onnxruntime ``quantize_static`` with the NPU recipe, on temporary files. ``record``:
    ``(n, sink)``: the float model's graph outputs on the first ``n`` calibration samples are
    appended to ``sink`` as ``(feed, {output name: value})``, from onnxruntime's own calibration runs."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    extra: dict[str, Any] = {
        "ActivationSymmetric": False,
        "WeightSymmetric": True,
        "ForceQuantizeNoInputCheck": True,  # quantize MaxPool/Transpose/... even after a float op
        "CalibMaxIntermediateOutputs": _merge_every(reader),  # merge ranges in batches: bounded memory
    }
    if keep_activations:
        extra["QDQKeepRemovableActivations"] = True
    if overrides:
        extra["TensorQuantOverrides"] = {k: [dict(d) for d in v] for k, v in overrides.items()}
    with tempfile.TemporaryDirectory(prefix="nafix-quant-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        big = model.ByteSize() > 1_500_000_000
        onnx.save_model(model, str(src), save_as_external_data=big, all_tensors_to_one_file=True,
                        location="float.onnx.data")
        try:
            # linear_time_quantization: same result, without onnxruntime's per-tensor graph rescans
            keep, sink = record if record is not None else (0, [])
            with _quiet_onnxruntime(), linear_time_quantization(), _calibration_without_spinning(), \
                    _calibration_reading_ahead(reader) as calibration_reader, \
                    _recording_calibration([o.name for o in model.graph.output], keep, sink):
                quantize_static(
                    str(src), str(dst), calibration_reader,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(op_types),
                    per_channel=ir.model_opset(model) >= MIN_PER_CHANNEL_OPSET,
                    reduce_range=False,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    nodes_to_quantize=list(nodes_to_quantize) or None,
                    nodes_to_exclude=list(nodes_to_exclude) or None,
                    use_external_data_format=big,
                    calibrate_method=_calibration_method(method),
                    extra_options=extra,
                )
        except NafixError:
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises many types; report the sentence
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{model_name}: onnxruntime could not quantize the model ({type(exc).__name__}: "
                             f"{msg[:300]}).") from exc
        out = onnx.load(str(dst))
    _drop_ort_metadata(out)
    _clamp_ir(out)
    return _with_shapes(out)


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with value_info for the tensors onnxruntime added (placement reads ranks and shapes)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - shapes only help the analysis
        return model


@dataclass
class QuantizeResult:
    """The quantized model and what happened.

    ``calibration``: ``random`` | ``npz`` | ``images`` (``random``: warn loudly); ``samples``: how many
    calibration samples onnxruntime consumed; ``ops_added``: NPU op types quantized beyond
    onnxruntime's defaults; ``islands``: float islands that remain (see :func:`float_islands`);
    ``problems``: what :func:`check_npu_quantization` still rejects (empty when all is well).
    """

    model: onnx.ModelProto
    calibration: str
    samples: int
    warnings: list[str] = field(default_factory=list)
    ops_added: list[str] = field(default_factory=list)
    islands: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    recipe: str = ST_RECIPE_TEXT
    #: ``(feed, {output name: float value})`` for the first calibration samples (``keep_reference``),
    #: recorded from onnxruntime's calibration runs of the float model: the reference the accuracy
    #: report compares against (empty when not asked for, or when the opset was converted).
    reference: list = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"calibration": self.calibration, "samples": self.samples, "recipe": self.recipe,
                "ops_added": list(self.ops_added), "islands": list(self.islands),
                "problems": list(self.problems), "warnings": list(self.warnings)}


def quantize_float_model(model: onnx.ModelProto, *, calib: CalibrationOptions, progress: Progress | None = None,
                         nodes_to_exclude: Sequence[str] = (), tensor_overrides: Mapping[str, list[dict]] | None = None,
                         profile=None, model_name: str = "the model", keep_reference: int = 0) -> QuantizeResult:
    """Quantize a float model the way the NPU accepts it, with onnxruntime ``quantize_static``.

    Recipe: QDQ, QInt8 activations (per tensor, asymmetric), QInt8 weights (symmetric, per channel),
    plus every NPU op onnxruntime skips by default (:func:`npu_op_types`), PRelu slopes symmetric per
    channel, ``ForceQuantizeNoInputCheck``. ``nodes_to_exclude``: node names left in float;
    ``tensor_overrides``: onnxruntime ``TensorQuantOverrides`` merged over nafix's (yours win).
    Graph input and output names are kept; the IR version is clamped to 10 and an opset below 13 is
    converted to 13 (per-channel Q/DQ needs it). ``model_name`` is used in error sentences.
    ``keep_reference``: keep the float model's outputs on the first that many calibration samples in
    :attr:`QuantizeResult.reference` (computed by onnxruntime's calibration runs, not run again); kept
    only when the model onnxruntime calibrates computes what ``model`` does (no opset conversion).
    """
    if _is_quantized(model):
        raise UsageError(f"{model_name}: the model is already quantized (it has QuantizeLinear/DequantizeLinear or "
                         "QLinear ops); quantize its float source, or use requantize_islands for its float parts.")
    warnings: list[str] = []
    work = _copy(model)
    _unique_names(work)
    dropped = _strip_initializer_inputs(work)
    if dropped:
        warnings.append(f"{len(dropped)} initializer(s) listed as graph inputs were treated as constants")
    converted = ir.model_opset(work) < MIN_PER_CHANNEL_OPSET
    if converted:
        work = _convert_opset(work, model_name)
        warnings.append(f"the model was converted from opset {ir.model_opset(model)} to {MIN_PER_CHANNEL_OPSET} "
                        "(per-channel QuantizeLinear/DequantizeLinear need it)")
    _drop_unused_initializers(work)
    known = {n.name for n in work.graph.node}
    unknown = [n for n in nodes_to_exclude if n not in known]
    if unknown:
        raise UsageError(f"{model_name}: no node named {', '.join(repr(u) for u in unknown[:3])} to exclude from quantization.")
    source = open_calibration(work, calib, model_name=model_name)
    warnings.extend(source.warnings)
    if source.kind == "random":
        warnings.append("calibrated on random data: activation ranges do not reflect real inputs; "
                        "re-run with real calibration data before deploying")
    profile = _load_profile(profile)
    op_types, added = npu_op_types(profile)
    overrides = _prelu_slope_overrides(work)
    overrides.update(_grouped_conv_transpose_overrides(work))
    overrides.update({k: list(v) for k, v in (tensor_overrides or {}).items()})
    reader = _reader(source, progress)
    log.info("quantizing %s with onnxruntime (%s) on %s", model_name, ST_RECIPE_TEXT, source.description)
    reference: list = []
    keep = 0 if converted else max(0, min(keep_reference, source.total))
    out = _run_quantize_static(work, reader, op_types=op_types, method=calib.method,
                               nodes_to_exclude=nodes_to_exclude, overrides=overrides, model_name=model_name,
                               record=(keep, reference))
    del work
    if len(reference) != keep:  # a calibrator that did not run every sample through the session
        reference = []
    _check_interface(model, out, model_name)
    problems = check_npu_quantization(out)
    islands = float_islands(out, profile=profile)
    for isl in islands:
        log.info("float island remains: %s (%s)", isl["name"], isl["op_type"])
    return QuantizeResult(out, source.kind, reader.done, warnings, added, islands, problems, reference=reference)


def _convert_opset(model: onnx.ModelProto, model_name: str) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_PER_CHANNEL_OPSET)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{model_name}: the model uses opset {ir.model_opset(model)} and could not be converted to opset "
                         f"{MIN_PER_CHANNEL_OPSET}, which per-channel quantization needs ({exc}).") from None


def _check_interface(before: onnx.ModelProto, after: onnx.ModelProto, model_name: str) -> None:
    inits = {t.name for t in before.graph.initializer}
    b_in = [i.name for i in before.graph.input if i.name not in inits]
    a_in = [i.name for i in after.graph.input]
    b_out = [o.name for o in before.graph.output]
    a_out = [o.name for o in after.graph.output]
    if b_in != a_in or b_out != a_out:
        raise InputError(f"{model_name}: quantization changed the graph interface (inputs {b_in} -> {a_in}, "
                         f"outputs {b_out} -> {a_out}); this is a nafix bug, please report it.")
