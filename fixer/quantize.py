"""Quantization for the Neural-ART NPU, always through ``onnxruntime.quantization``.

The NPU accepts one scheme (NEURAL_ART.md s2): int8 activations per tensor (asymmetric allowed),
int8 *symmetric per-channel* weights, QDQ format; uint8 activations are rejected by the compiler.
This module never implements a quantizer of its own: calibration and the choice of every new scale
and zero-point are onnxruntime's ``quantize_static``. What it adds is arithmetic on ranges that are
already calibrated (an exact uint8 -> int8 shift, a symmetric re-quantization of a known weight or
output range) and the plumbing around onnxruntime:

* calibration data (:class:`CalibrationOptions`, :func:`open_calibration`): a folder of ``.npz``
  files (one sample each, arrays keyed by input name), one ``.npz`` whose arrays carry a leading
  sample axis, a folder of images, or seeded random data (``calibration="random"``: say so loudly);
* :func:`quantize_float_model`: the ST recipe (QDQ, QInt8 activations asymmetric, QInt8 weights
  symmetric per channel) plus the NPU ops onnxruntime leaves in float by default
  (:func:`npu_op_types`), PRelu slopes quantized symmetric per channel, and a post-check
  (:func:`check_npu_quantization`) and the float islands that remain;
* :func:`convert_uint8_to_int8`: exact shift of uint8 activations to int8 (``q - 128``, zero-point
  ``- 128``, same scale: every dequantized value is unchanged) and symmetric per-channel
  re-quantization of uint8 (or asymmetric) weights, reporting the weight error;
* :func:`requantize_islands`: quantize only the float islands of a QDQ model (e.g. MobileFaceNet's
  float PRelu slopes) with onnxruntime, keeping every existing scale and zero-point;
* :func:`accuracy_report`: float vs quantized outputs (cosine, SNR, max abs error) and the tensors
  with the lowest SQNR, from ``onnxruntime.quantization.qdq_loss_debug``;
* :func:`symmetric_output_params`: zero-point 0 parameters covering an already calibrated range
  (for NAF013, the "scale-offset format" that blocked HW lowering).

Images: PPM/PGM/PNM (netpbm) and uncompressed BMP are decoded in numpy (no dependency). PNG and
JPEG need Pillow, which nafix does not depend on; it is imported only when such a file is found
(``pip install pillow``). Each image is converted to the model input: resized to ``image_size``
(default: the input's H, W) with ``bilinear`` (half-pixel centres) or ``nearest`` sampling, turned
to 1 or 3 channels (luminance or replication), put in ``channel_order``, normalised as
``(pixel * scale - mean) / std`` and laid out as NCHW or NHWC (``auto``: channels 1 or 3 on axis 1
-> NCHW, on the last axis -> NHWC). A uint8 model input receives the raw pixels, an int8 input
``pixel - 128``.

No printing: everything is logged through ``logging`` and returned in dataclasses; errors are
:class:`~fixer.errors.InputError` / :class:`~fixer.errors.UsageError` sentences naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import struct
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import InputError, NafixError, UsageError

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]

#: The NPU's scheme as onnxruntime ``quantize_static`` arguments (NEURAL_ART.md s2, 3P recipe).
ST_RECIPE_TEXT = ("QDQ, activation_type=QInt8, weight_type=QInt8, per_channel=True, "
                  "ActivationSymmetric=False, WeightSymmetric=True")
#: Newest IR version the supported onnxruntime releases load.
MAX_IR_VERSION = 10
#: Per-axis QuantizeLinear/DequantizeLinear (per-channel weights) exist from this opset on.
MIN_PER_CHANNEL_OPSET = 13

NUMPY_IMAGE_SUFFIXES = (".ppm", ".pgm", ".pnm", ".bmp")
PILLOW_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
IMAGE_SUFFIXES = NUMPY_IMAGE_SUFFIXES + PILLOW_IMAGE_SUFFIXES
PILLOW_HINT = "install Pillow to calibrate from PNG/JPEG: pip install pillow"

#: Ops that move int8 values without arithmetic: a uint8 -> int8 shift passes through them exactly.
EXACT_SHIFT_OPS = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Slice", "Split", "Concat",
    "Gather", "MaxPool", "DepthToSpace", "SpaceToDepth", "Tile", "Expand", "Pad", "Resize",
})
#: Weight input slots whose constants the NPU wants int8 symmetric per channel.
WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "PRelu")
#: Placement reasons that mean "this op would run on the NPU if it were quantized".
ISLAND_CONSTRAINTS = frozenset({"quantized_activations", "params_quantized", "prelu_slope_quantized", "float_island"})
_QUANT_REASONS = frozenset({"quantized_activations", "params_quantized", "prelu_slope_quantized"})
#: Keys onnxruntime's quantizer adds to the model metadata (removed again from nafix's results).
_ORT_METADATA_KEYS = ("onnx.infer", "onnx.quant.pre_process")

_NP_OF_ELEM = {
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64,
    TensorProto.BOOL: np.bool_,
}


# ================================================================================================
# Calibration data
# ================================================================================================


@dataclass(frozen=True)
class CalibrationOptions:
    """Where calibration samples come from and how images become model inputs.

    ``path``: a folder of ``.npz`` files (one sample each, arrays keyed by input name, the batch axis
    optional), a single ``.npz`` whose arrays carry a leading sample axis, or a folder of images
    (``.ppm/.pgm/.pnm/.bmp`` decoded in numpy; ``.png/.jpg/.jpeg`` need Pillow). ``None``: seeded
    random data (``random_samples`` samples, each input in its plausible range) - the result then
    says ``calibration="random"`` and the caller must warn loudly, the ranges mean little.
    Images: resized to ``image_size`` (H, W; default the model input's) with ``resize``
    (``bilinear`` | ``nearest``), ``channel_order`` ``rgb`` | ``bgr``, normalised as
    ``(pixel * scale - mean) / std`` (``mean``/``std``: one value or one per channel), laid out by
    ``layout`` (``nchw`` | ``nhwc`` | ``auto``). At most ``max_samples`` samples are used (files in
    sorted order). ``method``: onnxruntime's calibration method (``minmax`` | ``entropy`` |
    ``percentile``).
    """

    path: str | None = None
    image_size: tuple[int, int] | None = None
    layout: str = "auto"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channel_order: str = "rgb"
    max_samples: int = 200
    seed: int = 0
    random_samples: int = 16
    resize: str = "bilinear"
    method: str = "minmax"

    def __post_init__(self) -> None:
        if self.layout not in ("auto", "nchw", "nhwc"):
            raise UsageError(f"the calibration layout must be auto, nchw or nhwc, not '{self.layout}'.")
        if self.channel_order not in ("rgb", "bgr"):
            raise UsageError(f"the calibration channel order must be rgb or bgr, not '{self.channel_order}'.")
        if self.resize not in ("bilinear", "nearest"):
            raise UsageError(f"the calibration resize method must be bilinear or nearest, not '{self.resize}'.")
        if self.method not in ("minmax", "entropy", "percentile"):
            raise UsageError(f"the calibration method must be minmax, entropy or percentile, not '{self.method}'.")
        if self.max_samples < 1 or self.random_samples < 1:
            raise UsageError("the number of calibration samples must be at least 1.")
        if self.image_size is not None and (len(self.image_size) != 2 or min(self.image_size) < 1):
            raise UsageError(f"the calibration image size must be two positive integers (H, W), not {self.image_size}.")
        if self.std is not None and any(float(s) == 0.0 for s in self.std):
            raise UsageError("the calibration std must not contain 0.")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise UsageError(f"the calibration scale must be a positive number, not {self.scale}.")


@dataclass(frozen=True)
class InputSpec:
    """One graph input as calibration sees it: name, shape (None for a dynamic dimension), dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype

    def concrete_shape(self) -> tuple[int, ...]:
        """The shape with dynamic dimensions set to 1 (a batch of one)."""
        return tuple(1 if d is None else d for d in self.shape)

    def describe(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real graph inputs (initializers listed as inputs, IR < 4 style, excluded)."""
    inits = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim)
        specs.append(InputSpec(vi.name, dims, np.dtype(_NP_OF_ELEM.get(tt.elem_type, np.float32))))
    return specs


@dataclass
class CalibrationSource:
    """Calibration samples, produced lazily one at a time (images and .npz folders are streamed).

    ``kind``: ``random`` | ``npz`` | ``images``; ``total``: how many samples ``samples()`` yields.
    """

    kind: str
    total: int
    specs: list[InputSpec]
    _factory: Callable[[], Iterator[dict[str, np.ndarray]]]
    description: str = ""
    warnings: list[str] = field(default_factory=list)

    def samples(self) -> Iterator[dict[str, np.ndarray]]:
        return self._factory()

    def take(self, n: int) -> list[dict[str, np.ndarray]]:
        """The first ``n`` samples as a list (e.g. for :func:`accuracy_report`)."""
        out = []
        for feed in self.samples():
            if len(out) >= n:
                break
            out.append(feed)
        return out


def open_calibration(model: onnx.ModelProto, calib: CalibrationOptions, *,
                     model_name: str = "the model") -> CalibrationSource:
    """Check ``calib`` against the model's inputs and return a lazy :class:`CalibrationSource`.

    The first sample is read and validated here, so a wrong file fails before onnxruntime starts;
    later samples are validated as they are read, each error naming its file and input.
    """
    specs = input_specs(model)
    if not specs:
        raise InputError(f"{model_name}: the model has no graph input to calibrate.")
    if calib.path is None:
        src = _random_source(model, specs, calib)
    else:
        p = Path(calib.path)
        if not p.exists():
            raise InputError(f"{p}: the calibration data path does not exist.")
        if p.is_file():
            if p.suffix.lower() != ".npz":
                raise InputError(f"{p}: a calibration file must be an .npz (arrays keyed by input name); "
                                 "images go in a folder.")
            src = _single_npz_source(p, specs, calib)
        else:
            src = _folder_source(p, specs, calib, model_name)
    first = next(iter(src.samples()), None)
    if first is None:
        raise InputError(f"{calib.path}: no calibration sample could be read.")
    return src


def _random_source(model: onnx.ModelProto, specs: list[InputSpec], calib: CalibrationOptions) -> CalibrationSource:
    ranges = {s.name: _input_range(model, s.name) for s in specs}

    def gen() -> Iterator[dict[str, np.ndarray]]:
        rng = np.random.default_rng(calib.seed)
        for _ in range(calib.random_samples):
            feed = {}
            for s in specs:
                shape = s.concrete_shape()
                if s.dtype.kind == "f":
                    lo, hi = ranges[s.name] or (-1.0, 1.0)
                    feed[s.name] = rng.uniform(lo, hi, size=shape).astype(s.dtype)
                elif s.dtype == np.bool_:
                    feed[s.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
                else:
                    info = np.iinfo(s.dtype)
                    lo, hi = max(info.min, -128), min(info.max, 255)
                    if s.dtype.itemsize > 2:
                        lo, hi = 0, 3  # indices, lengths: keep them small and valid
                    feed[s.name] = rng.integers(lo, hi + 1, size=shape).astype(s.dtype)
            yield feed

    return CalibrationSource("random", calib.random_samples, specs, gen,
                             description=f"{calib.random_samples} seeded random samples (seed {calib.seed})")


def _input_range(model: onnx.ModelProto, name: str) -> tuple[float, float] | None:
    """The float range a QuantizeLinear right after input ``name`` can represent (None: unknown)."""
    consts = _constants(model)
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] == name:
            s = consts.get(node.input[1])
            z = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
            if s is None or z is None or s.size != 1:
                return None
            info = np.iinfo(z.dtype)
            zf, sf = float(z.reshape(-1)[0]), float(s.reshape(-1)[0])
            return (info.min - zf) * sf, (info.max - zf) * sf
    return None


def _folder_source(folder: Path, specs: list[InputSpec], calib: CalibrationOptions, model_name: str) -> CalibrationSource:
    files = sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith("."))
    npz = [f for f in files if f.suffix.lower() == ".npz"]
    images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
    if npz and images:
        raise UsageError(f"{folder}: the calibration folder mixes .npz files and images; keep one kind of sample per folder.")
    if not npz and not images:
        raise InputError(f"{folder}: the calibration folder contains no .npz files and no images "
                         f"({', '.join(s.lstrip('.') for s in IMAGE_SUFFIXES)}).")
    ignored = len(files) - len(npz) - len(images)
    warnings = [f"{folder}: {ignored} file(s) that are neither .npz nor images were ignored"] if ignored else []
    if npz:
        chosen = npz[: calib.max_samples]

        def gen_npz() -> Iterator[dict[str, np.ndarray]]:
            for f in chosen:
                yield _npz_sample(f, specs)

        return CalibrationSource("npz", len(chosen), specs, gen_npz,
                                 description=f"{len(chosen)} .npz file(s) from {folder}", warnings=warnings)
    chosen = images[: calib.max_samples]
    if any(f.suffix.lower() in PILLOW_IMAGE_SUFFIXES for f in chosen):
        _require_pillow(next(f for f in chosen if f.suffix.lower() in PILLOW_IMAGE_SUFFIXES))
    spec, layout, size = _image_target(specs, calib, model_name, folder)

    def gen_img() -> Iterator[dict[str, np.ndarray]]:
        for f in chosen:
            img = read_image(f)
            yield {spec.name: image_to_input(img, spec, layout=layout, size=size, calib=calib)}

    return CalibrationSource("images", len(chosen), specs, gen_img,
                             description=f"{len(chosen)} image(s) from {folder} -> '{spec.name}' "
                                         f"{layout.upper()} {size[0]}x{size[1]}", warnings=warnings)


def _single_npz_source(path: Path, specs: list[InputSpec], calib: CalibrationOptions) -> CalibrationSource:
    data = _load_npz(path)
    batches: dict[str, list[np.ndarray]] = {}
    for s in specs:
        if s.name not in data:
            raise InputError(f"{path}: has no array named '{s.name}' for the model input '{s.name}' "
                             f"(it has {', '.join(sorted(data)) or 'no arrays'}).")
        arr = data[s.name]
        rank = len(s.shape)
        if arr.ndim == rank + 1:
            samples = [arr[i] for i in range(arr.shape[0])]
        elif arr.ndim == rank and rank > 0 and s.shape[0] == 1 and arr.shape[0] > 1:
            samples = [arr[i:i + 1] for i in range(arr.shape[0])]
        else:
            samples = [arr]
        batches[s.name] = [_check_array(a, s, path) for a in samples]
    counts = {k: len(v) for k, v in batches.items()}
    if len(set(counts.values())) > 1:
        raise InputError(f"{path}: the arrays hold different numbers of samples "
                         f"({', '.join(f'{k}: {v}' for k, v in counts.items())}).")
    n = min(next(iter(counts.values())), calib.max_samples)
    extra = sorted(set(data) - {s.name for s in specs})
    warnings = [f"{path}: array(s) {', '.join(extra)} match no model input and were ignored"] if extra else []

    def gen() -> Iterator[dict[str, np.ndarray]]:
        for i in range(n):
            yield {k: v[i] for k, v in batches.items()}

    return CalibrationSource("npz", n, specs, gen, description=f"{n} sample(s) from {path}", warnings=warnings)


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except Exception as exc:  # noqa: BLE001 - any decoding problem is the file's
        raise InputError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc}).") from None


def _npz_sample(path: Path, specs: list[InputSpec]) -> dict[str, np.ndarray]:
    data = _load_npz(path)
    feed = {}
    for s in specs:
        if s.name not in data:
            raise InputError(f"{path}: has no array named '{s.name}' for the model input '{s.name}' "
                             f"(it has {', '.join(sorted(data)) or 'no arrays'}).")
        feed[s.name] = _check_array(data[s.name], s, path)
    return feed


def _check_array(arr: np.ndarray, spec: InputSpec, path: Path) -> np.ndarray:
    """``arr`` as a sample for ``spec``: same rank (a missing batch axis of 1 is added), same static
    dimensions, same kind of dtype (float widths are converted)."""
    arr = np.asarray(arr)
    rank = len(spec.shape)
    if arr.ndim == rank - 1 and rank > 0 and spec.shape[0] in (1, None):
        arr = arr[None]
    if arr.ndim != rank or any(d is not None and d != a for d, a in zip(spec.shape, arr.shape)):
        raise InputError(f"{path}: the array '{spec.name}' has shape {list(arr.shape)} but the model input "
                         f"'{spec.name}' is {spec.describe()}.")
    if arr.dtype != spec.dtype:
        same_kind = (arr.dtype.kind == "f" and spec.dtype.kind == "f") or (
            arr.dtype.kind in "iu" and spec.dtype.kind in "iu" and np.can_cast(arr.dtype, spec.dtype, "same_kind")
            and arr.size and arr.min() >= np.iinfo(spec.dtype).min and arr.max() <= np.iinfo(spec.dtype).max)
        if not same_kind:
            raise InputError(f"{path}: the array '{spec.name}' has dtype {arr.dtype.name} but the model input "
                             f"'{spec.name}' is {spec.dtype.name}; convert the data (for images: scale to the "
                             "model's float range) before saving it.")
        arr = arr.astype(spec.dtype)
    return np.ascontiguousarray(arr)


def _image_target(specs: list[InputSpec], calib: CalibrationOptions, model_name: str,
                  folder: Path) -> tuple[InputSpec, str, tuple[int, int]]:
    """(the image input, its layout, the H x W images are resized to)."""
    if len(specs) != 1:
        raise UsageError(f"{folder}: calibrating from images needs a model with one image input, but {model_name} "
                         f"has {len(specs)} inputs ({', '.join(s.name for s in specs)}); use a folder of .npz "
                         "files keyed by input name instead.")
    spec = specs[0]
    if len(spec.shape) != 4:
        raise UsageError(f"{folder}: the model input '{spec.name}' is {spec.describe()}, not a 4-D image tensor; "
                         "calibrate it from .npz files instead.")
    layout = calib.layout
    if layout == "auto":
        c1, c3 = spec.shape[1], spec.shape[3]
        if c1 in (1, 3):
            layout = "nchw"
        elif c3 in (1, 3):
            layout = "nhwc"
        else:
            raise UsageError(f"{folder}: cannot tell the layout of the model input '{spec.name}' "
                             f"({spec.describe()}): neither axis 1 nor the last axis has 1 or 3 channels; "
                             "give the layout (nchw or nhwc).")
    hw = (spec.shape[2], spec.shape[3]) if layout == "nchw" else (spec.shape[1], spec.shape[2])
    channels = spec.shape[1] if layout == "nchw" else spec.shape[3]
    if channels not in (1, 3):
        raise UsageError(f"{folder}: the model input '{spec.name}' ({spec.describe()}, {layout.upper()}) has "
                         f"{channels} channels; images give 1 or 3.")
    size = calib.image_size or hw
    if size[0] is None or size[1] is None:
        raise UsageError(f"{folder}: the model input '{spec.name}' ({spec.describe()}) has a dynamic height or "
                         "width; give the image size (H, W) to resize calibration images to.")
    return spec, layout, (int(size[0]), int(size[1]))


def _require_pillow(example: Path):
    try:
        from PIL import Image  # noqa: F401
    except ImportError:
        raise UsageError(f"{example}: {PILLOW_HINT} (nafix decodes only PPM/PGM/PNM and uncompressed BMP "
                         "itself; or convert the images to PPM).") from None
    from PIL import Image

    return Image


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image into an H x W x C float32 array of 0..255 values (C = 1 or 3, RGB order).

    PPM/PGM/PNM and uncompressed BMP are decoded in numpy; PNG/JPEG (and compressed BMP) need Pillow.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: the image cannot be read ({exc.strerror or exc}).") from None
    if suffix in (".ppm", ".pgm", ".pnm"):
        img = _decode_pnm(raw, p)
    elif suffix == ".bmp":
        img = _decode_bmp(raw, p)
        if img is None:
            img = _decode_pillow(p)
    elif suffix in PILLOW_IMAGE_SUFFIXES:
        img = _decode_pillow(p)
    else:
        raise InputError(f"{p}: unsupported image type '{suffix}' (use {', '.join(IMAGE_SUFFIXES)}).")
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] == 4:
        img = img[:, :, :3]
    if img.shape[2] == 2:  # gray + alpha
        img = img[:, :, :1]
    return img.astype(np.float32)


def _decode_pillow(p: Path) -> np.ndarray:
    Image = _require_pillow(p)
    try:
        with Image.open(p) as im:
            im = im.convert("L" if im.mode in ("L", "I", "I;16", "F", "1") else "RGB")
            return np.asarray(im, dtype=np.float32)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{p}: not a readable image ({type(exc).__name__}: {exc}).") from None


def _decode_pnm(raw: bytes, p: Path) -> np.ndarray:
    """Netpbm P2/P3 (ASCII) and P5/P6 (binary) gray/RGB, 8 or 16 bits."""
    magic = raw[:2]
    if magic not in (b"P2", b"P3", b"P5", b"P6"):
        raise InputError(f"{p}: not a PGM/PPM image (P2, P3, P5 or P6 header expected).")
    channels = 3 if magic in (b"P3", b"P6") else 1
    tokens: list[bytes] = []
    pos = 2
    while len(tokens) < 3:
        while pos < len(raw) and raw[pos:pos + 1].isspace():
            pos += 1
        if pos < len(raw) and raw[pos:pos + 1] == b"#":
            while pos < len(raw) and raw[pos:pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < len(raw) and not raw[pos:pos + 1].isspace() and raw[pos:pos + 1] != b"#":
            pos += 1
        if start == pos:
            raise InputError(f"{p}: truncated PGM/PPM header.")
        tokens.append(raw[start:pos])
    try:
        width, height, maxval = (int(t) for t in tokens)
    except ValueError:
        raise InputError(f"{p}: bad PGM/PPM header (width, height and maxval must be integers).") from None
    if width < 1 or height < 1 or not 0 < maxval < 65536:
        raise InputError(f"{p}: bad PGM/PPM header ({width}x{height}, maxval {maxval}).")
    count = width * height * channels
    if magic in (b"P5", b"P6"):
        pos += 1  # exactly one whitespace byte after maxval
        dtype = np.dtype(">u2") if maxval > 255 else np.dtype(np.uint8)
        body = raw[pos:pos + count * dtype.itemsize]
        if len(body) < count * dtype.itemsize:
            raise InputError(f"{p}: truncated image data ({len(body)} of {count * dtype.itemsize} bytes).")
        values = np.frombuffer(body, dtype=dtype).astype(np.float32)
    else:
        try:
            values = np.array(raw[pos:].split()[:count], dtype=np.float32)
        except ValueError:
            raise InputError(f"{p}: bad ASCII PGM/PPM data.") from None
        if values.size < count:
            raise InputError(f"{p}: truncated image data ({values.size} of {count} values).")
    img = values.reshape(height, width, channels)
    if maxval != 255:
        img = img * (255.0 / maxval)
    return img


def _decode_bmp(raw: bytes, p: Path) -> np.ndarray | None:
    """Uncompressed 8 (palette), 24 and 32-bit BMP; None for other variants (left to Pillow)."""
    if raw[:2] != b"BM" or len(raw) < 54:
        raise InputError(f"{p}: not a BMP image.")
    offset = struct.unpack_from("<I", raw, 10)[0]
    header_size = struct.unpack_from("<I", raw, 14)[0]
    if header_size < 40:
        return None
    width, height, _, bpp, compression = struct.unpack_from("<iiHHI", raw, 18)
    if compression not in (0, 3) or bpp not in (8, 24, 32) or width < 1 or height == 0:
        return None
    if compression == 3 and bpp != 32:
        return None
    top_down = height < 0
    h = abs(height)
    stride = ((width * bpp + 31) // 32) * 4
    if len(raw) < offset + stride * h:
        raise InputError(f"{p}: truncated BMP data.")
    rows = np.frombuffer(raw, dtype=np.uint8, count=stride * h, offset=offset).reshape(h, stride)
    if bpp == 8:
        ncolors = struct.unpack_from("<I", raw, 46)[0] or 256
        pal = np.frombuffer(raw, dtype=np.uint8, count=ncolors * 4, offset=14 + header_size).reshape(ncolors, 4)
        img = pal[rows[:, :width]][:, :, [2, 1, 0]]
    else:
        nb = bpp // 8
        img = rows[:, : width * nb].reshape(h, width, nb)[:, :, [2, 1, 0]]
    if not top_down:
        img = img[::-1]
    return np.ascontiguousarray(img).astype(np.float32)


def resize_image(img: np.ndarray, size: tuple[int, int], method: str = "bilinear") -> np.ndarray:
    """Resize an H x W x C array to ``size`` (H, W): ``nearest`` or ``bilinear`` with half-pixel
    centres (the convention of PIL and of ONNX Resize ``half_pixel``)."""
    h, w = img.shape[:2]
    oh, ow = size
    if (h, w) == (oh, ow):
        return img
    if method == "nearest":
        ys = np.minimum((np.arange(oh) * h / oh).astype(np.int64), h - 1)
        xs = np.minimum((np.arange(ow) * w / ow).astype(np.int64), w - 1)
        return img[ys][:, xs]
    ys = np.clip((np.arange(oh) + 0.5) * h / oh - 0.5, 0, h - 1)
    xs = np.clip((np.arange(ow) + 0.5) * w / ow - 0.5, 0, w - 1)
    y0 = np.floor(ys).astype(np.int64)
    x0 = np.floor(xs).astype(np.int64)
    y1 = np.minimum(y0 + 1, h - 1)
    x1 = np.minimum(x0 + 1, w - 1)
    wy = (ys - y0)[:, None, None].astype(np.float32)
    wx = (xs - x0)[None, :, None].astype(np.float32)
    f = img.astype(np.float32)
    top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
    bottom = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def image_to_input(img: np.ndarray, spec: InputSpec, *, layout: str, size: tuple[int, int],
                   calib: CalibrationOptions) -> np.ndarray:
    """One decoded image (H x W x C, 0..255, RGB) as a batch-of-one sample for ``spec``."""
    channels = spec.shape[1] if layout == "nchw" else spec.shape[3]
    x = resize_image(img, size, calib.resize)
    if channels == 1 and x.shape[2] == 3:
        x = (x @ np.array([0.299, 0.587, 0.114], np.float32))[:, :, None]
    elif channels == 3 and x.shape[2] == 1:
        x = np.repeat(x, 3, axis=2)
    if calib.channel_order == "bgr":
        x = x[:, :, ::-1]
    if spec.dtype.kind == "f":
        x = x * np.float32(calib.scale)
        if calib.mean is not None:
            x = x - _per_channel(calib.mean, channels, "mean")
        if calib.std is not None:
            x = x / _per_channel(calib.std, channels, "std")
    elif spec.dtype == np.uint8:
        x = np.clip(np.rint(x), 0, 255)
    elif spec.dtype == np.int8:
        x = np.clip(np.rint(x), 0, 255) - 128
    else:
        raise UsageError(f"the model input '{spec.name}' is {spec.dtype.name}; images can feed float, uint8 or "
                         "int8 inputs only (use .npz files).")
    x = np.transpose(x, (2, 0, 1)) if layout == "nchw" else x
    return np.ascontiguousarray(x[None].astype(spec.dtype))


def _per_channel(values: Sequence[float], channels: int, what: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32).reshape(-1)
    if v.size not in (1, channels):
        raise UsageError(f"the calibration {what} has {v.size} values; give 1 or {channels} (one per channel).")
    return v


class NafixCalibrationReader:
    """An ``onnxruntime.quantization.CalibrationDataReader`` streaming a :class:`CalibrationSource`:
    one sample is read per ``get_next()``; ``progress(done, total)`` is called after each.

    (``CalibrationDataReader`` is an ABC whose ``__subclasshook__`` accepts any class with
    ``get_next``, so this is a subclass without importing onnxruntime at module import time.)
    """

    def __init__(self, source: CalibrationSource, progress: Progress | None = None):
        self.source = source
        self.progress = progress
        self.done = 0
        self._it: Iterator[dict[str, np.ndarray]] | None = None

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._it = self.source.samples()
        feed = next(self._it, None)
        if feed is None:
            return None
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.source.total)
        return feed

    def rewind(self) -> None:
        self._it = None
        self.done = 0

    def __iter__(self):
        return self

    def __next__(self):
        feed = self.get_next()
        if feed is None:
            raise StopIteration
        return feed

    def __len__(self) -> int:
        return self.source.total


def _reader(source: CalibrationSource, progress: Progress | None) -> NafixCalibrationReader:
    return NafixCalibrationReader(source, progress)


class _FeedsReader:
    """A CalibrationDataReader over an in-memory list of feeds (for qdq_loss_debug)."""

    def __init__(self, feeds: Sequence[Mapping[str, np.ndarray]]):
        self._feeds = list(feeds)
        self._i = 0

    def get_next(self):
        if self._i >= len(self._feeds):
            return None
        self._i += 1
        return dict(self._feeds[self._i - 1])

    def __iter__(self):
        return self

    def __next__(self):
        f = self.get_next()
        if f is None:
            raise StopIteration
        return f


# ================================================================================================
# Shared model helpers (ONNX protos)
# ================================================================================================


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
                elif a.name == "value_float":
                    out[n.output[0]] = np.array(a.f, np.float32)
                elif a.name == "value_int":
                    out[n.output[0]] = np.array(a.i, np.int64)
    return out


def _opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _set_attr(node: onnx.NodeProto, name: str, value) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))


def _unique_names(model: onnx.ModelProto) -> None:
    """Give every node a unique name (onnxruntime's node lists and nafix's placement use them)."""
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            base = n.name or f"{n.op_type}_{i}"
            name, k = base, 0
            while name in seen:
                name = f"{base}__nafix_{k}"
                k += 1
            n.name = name
        seen.add(n.name)


def _strip_initializer_inputs(model: onnx.ModelProto) -> list[str]:
    """Drop initializers listed as graph inputs (IR < 4 style): they are constants to quantize, not inputs."""
    inits = {t.name for t in model.graph.initializer}
    dropped = [vi.name for vi in model.graph.input if vi.name in inits]
    if dropped:
        keep = [vi for vi in model.graph.input if vi.name not in inits]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        if model.ir_version < 4:
            model.ir_version = 4
    return dropped


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    g = model.graph
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= {i for sn in a.g.node for i in sn.input}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def _clamp_ir(model: onnx.ModelProto) -> None:
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION


def _drop_ort_metadata(model: onnx.ModelProto) -> None:
    keep = [(p.key, p.value) for p in model.metadata_props if p.key not in _ORT_METADATA_KEYS]
    del model.metadata_props[:]
    for k, v in keep:
        model.metadata_props.add(key=k, value=v)


def _remove_dead(model: onnx.ModelProto) -> int:
    """Remove nodes whose outputs nobody reads, then unused initializers; returns nodes removed."""
    g = model.graph
    removed = 0
    while True:
        used = {i for n in g.node for i in n.input if i} | {o.name for o in g.output}
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    used |= {i for sn in a.g.node for i in sn.input}
        dead = [k for k, n in enumerate(g.node) if n.output and not any(o in used for o in n.output if o)]
        if not dead:
            break
        for k in reversed(dead):
            del g.node[k]
        removed += len(dead)
    used = {i for n in g.node for i in n.input if i} | {o.name for o in g.output} | {i.name for i in g.input}
    keep = [t for t in g.initializer if t.name in used]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)
    vi_keep = [v for v in g.value_info if v.name in used or any(v.name in n.output for n in g.node)]
    del g.value_info[:]
    g.value_info.extend(vi_keep)
    return removed


def _is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") or n.op_type.startswith("QLinear")
               or n.op_type in ("ConvInteger", "MatMulInteger") for n in model.graph.node)


def _load_profile(profile):
    if profile is not None:
        return profile
    from .npu.profile import load_profile

    return load_profile(None)


@contextlib.contextmanager
def _quiet_onnxruntime():
    """onnxruntime.quantization logs advice on the root logger; route it to nafix's debug log."""

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            path = record.pathname.replace("\\", "/")
            if "onnxruntime/quantization" in path:
                log.debug("onnxruntime.quantization: %s", record.getMessage())
                return False
            return True

    root = logging.getLogger()
    flt = _Filter()
    root.addFilter(flt)
    try:
        yield
    finally:
        root.removeFilter(flt)


# ================================================================================================
# Which ops onnxruntime quantizes
# ================================================================================================


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
    per_channel = _opset(model) >= MIN_PER_CHANNEL_OPSET
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
        if w.dims[1] == 1 and _opset(model) >= MIN_PER_CHANNEL_OPSET:
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


def _run_quantize_static(model: onnx.ModelProto, reader, *, op_types: Sequence[str], method: str,
                         nodes_to_quantize: Sequence[str] = (), nodes_to_exclude: Sequence[str] = (),
                         overrides: Mapping[str, list[dict]] | None = None, keep_activations: bool = False,
                         model_name: str) -> onnx.ModelProto:
    """onnxruntime ``quantize_static`` with the NPU recipe, on temporary files."""
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
            with _quiet_onnxruntime():
                quantize_static(
                    str(src), str(dst), reader,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(op_types),
                    per_channel=_opset(model) >= MIN_PER_CHANNEL_OPSET,
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


# ================================================================================================
# Post-checks
# ================================================================================================


def _weight_axis(node: onnx.NodeProto, rank: int) -> int | None:
    """The output-channel axis of ``node``'s weight (input 1), None when per-channel does not apply."""
    op = node.op_type
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1 if int(_attr(node, "group", 1)) == 1 else None
    if op == "Gemm":
        return 0 if int(_attr(node, "transB", 0)) else 1
    if op == "MatMul":
        return rank - 1 if rank == 2 else None
    if op == "PRelu":
        return 0 if rank >= 1 else None
    return None


def check_npu_quantization(model: onnx.ModelProto, *, allow_uint8_io: bool = False) -> list[str]:
    """What in ``model`` the NPU's scheme rejects, one sentence each (empty: all good).

    Checks: no uint8 tensor anywhere (with ``allow_uint8_io``, a uint8 graph input read by
    DequantizeLinear and a uint8 graph output written by QuantizeLinear are allowed); every weight of
    Conv/ConvTranspose/Gemm/MatMul and every PRelu slope goes through a DequantizeLinear of an int8
    constant with all zero-points 0, per channel (one scale per output channel, ``axis`` set) when
    the weight has more than one channel.
    """
    g = model.graph
    consts = _constants(model)
    producers = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    problems: list[str] = []
    from .npu.placement import is_oe_export

    oe = is_oe_export(model)  # ST's own export keeps constant quantization in a side _Q.json
    io_ok: set[str] = set()
    if allow_uint8_io:
        for vi in g.input:
            if consumers[vi.name] and all(c.op_type == "DequantizeLinear" for c in consumers[vi.name]):
                io_ok.add(vi.name)
        for vi in g.output:
            p = producers.get(vi.name)
            if p is not None and p.op_type == "QuantizeLinear":
                io_ok.add(vi.name)
    edge_nodes = {n.name for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in io_ok}
    edge_nodes |= {n.name for n in g.node if n.op_type == "QuantizeLinear" and n.output[0] in io_ok}
    for t in g.initializer:
        if t.data_type == TensorProto.UINT8 and any(c.name not in edge_nodes for c in consumers[t.name]):
            problems.append(f"the constant '{t.name}' is uint8")
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.UINT8 and vi.name not in io_ok:
            problems.append(f"the tensor '{vi.name}' is uint8")
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zp_name = n.input[2] if len(n.input) > 2 else ""
            io_name = n.input[0] if n.op_type == "DequantizeLinear" else n.output[0]
            if io_name in io_ok:
                continue
            if not zp_name and n.op_type == "QuantizeLinear":
                problems.append(f"'{n.name}' has no zero-point, so it produces uint8")
            elif zp_name in consts and consts[zp_name].dtype == np.uint8:
                problems.append(f"'{n.name}' uses a uint8 zero-point")
    for n in g.node:
        if n.op_type not in WEIGHT_OPS or len(n.input) < 2:
            continue
        w = n.input[1]
        if w in consts:
            if consts[w].dtype.kind == "f" and not oe:
                problems.append(f"the weight '{w}' of '{n.name}' ({n.op_type}) is a float constant, not quantized")
            continue
        dq = producers.get(w)
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in consts:
            continue  # an activation (MatMul of two tensors) - not a weight
        q = consts[dq.input[0]]
        scale = consts.get(dq.input[1])
        zp = consts.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
        where = f"the weight '{w}' of '{n.name}' ({n.op_type})"
        if q.dtype != np.int8:
            problems.append(f"{where} is stored as {q.dtype.name}, not int8")
            continue
        if zp is not None and np.any(zp != 0):
            problems.append(f"{where} is asymmetric (non-zero zero-point)")
        axis = _weight_axis(n, q.ndim)
        if axis is None or scale is None:
            continue
        channels = q.shape[axis] if q.ndim > axis else 1
        if channels > 1 and scale.size == 1:
            problems.append(f"{where} is quantized per tensor, not per channel")
        elif scale.size > 1:
            dq_axis = int(_attr(dq, "axis", 1))
            dq_axis = dq_axis + q.ndim if dq_axis < 0 else dq_axis
            if dq_axis != axis or scale.size != channels:
                problems.append(f"{where} is quantized along axis {dq_axis}, not its output-channel axis {axis}")
    return problems


def _analysis_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for nafix's placement: unique node names, dynamic input dimensions pinned to 1 (as
    calibration runs them), shapes re-inferred."""
    m = _copy(model)
    _unique_names(m)
    _strip_initializer_inputs(m)
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 0:
                d.dim_value = 1
    del m.graph.value_info[:]
    for out in m.graph.output:
        if any(not d.HasField("dim_value") for d in out.type.tensor_type.shape.dim):
            out.type.tensor_type.ClearField("shape")
    try:
        m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - shapes only refine the placement
        pass
    return m


def float_islands(model: onnx.ModelProto, *, profile=None) -> list[dict]:
    """Nodes nafix's placement puts in SW because something around them is not quantized.

    Each entry: ``{"name", "op_type", "constraints", "reasons"}`` (from :func:`fixer.api.analyze_model`,
    SW nodes failing ``quantized_activations``, ``params_quantized``, ``prelu_slope_quantized`` or
    marked ``float_island``).
    """
    from .api import analyze_model

    profile = _load_profile(profile)
    analysis = analyze_model(_analysis_copy(model), profile=profile)
    out = []
    for row in analysis.sw_nodes():
        hit = [c for c in row["constraints"] if c in ISLAND_CONSTRAINTS]
        if hit:
            out.append({"name": row["name"], "op_type": row["op_type"], "constraints": hit, "reasons": row["reasons"]})
    return out


# ================================================================================================
# 2. Quantizing a float model
# ================================================================================================


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

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"calibration": self.calibration, "samples": self.samples, "recipe": self.recipe,
                "ops_added": list(self.ops_added), "islands": list(self.islands),
                "problems": list(self.problems), "warnings": list(self.warnings)}


def quantize_float_model(model: onnx.ModelProto, *, calib: CalibrationOptions, progress: Progress | None = None,
                         nodes_to_exclude: Sequence[str] = (), tensor_overrides: Mapping[str, list[dict]] | None = None,
                         profile=None, model_name: str = "the model") -> QuantizeResult:
    """Quantize a float model the way the NPU accepts it, with onnxruntime ``quantize_static``.

    Recipe: QDQ, QInt8 activations (per tensor, asymmetric), QInt8 weights (symmetric, per channel),
    plus every NPU op onnxruntime skips by default (:func:`npu_op_types`), PRelu slopes symmetric per
    channel, ``ForceQuantizeNoInputCheck``. ``nodes_to_exclude``: node names left in float;
    ``tensor_overrides``: onnxruntime ``TensorQuantOverrides`` merged over nafix's (yours win).
    Graph input and output names are kept; the IR version is clamped to 10 and an opset below 13 is
    converted to 13 (per-channel Q/DQ needs it). ``model_name`` is used in error sentences.
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
    if _opset(work) < MIN_PER_CHANNEL_OPSET:
        work = _convert_opset(work, model_name)
        warnings.append(f"the model was converted from opset {_opset(model)} to {MIN_PER_CHANNEL_OPSET} "
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
    out = _run_quantize_static(work, reader, op_types=op_types, method=calib.method,
                               nodes_to_exclude=nodes_to_exclude, overrides=overrides, model_name=model_name)
    _check_interface(model, out, model_name)
    problems = check_npu_quantization(out)
    islands = float_islands(out, profile=profile)
    for isl in islands:
        log.info("float island remains: %s (%s)", isl["name"], isl["op_type"])
    return QuantizeResult(out, source.kind, reader.done, warnings, added, islands, problems)


def _convert_opset(model: onnx.ModelProto, model_name: str) -> onnx.ModelProto:
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, MIN_PER_CHANNEL_OPSET)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{model_name}: the model uses opset {_opset(model)} and could not be converted to opset "
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


# ================================================================================================
# 3. uint8 -> int8
# ================================================================================================


@dataclass
class Uint8Conversion:
    """The converted model and what changed. Unpacks as ``model, changes = convert_uint8_to_int8(m)``.

    ``io_changes``: graph edges whose type changed (only with ``io="int8"``), as
    :class:`fixer.rewriters.IoChange`; ``weight_errors``: per re-quantized weight, the max abs
    difference between the old and new dequantized values; ``exact``: True when only activations
    (and exactly shifted constants) changed, so every output is bit-identical.
    """

    model: onnx.ModelProto
    changes: list[str]
    io_changes: list = field(default_factory=list)
    weight_errors: dict[str, float] = field(default_factory=dict)
    shifted_tensors: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def max_weight_error(self) -> float:
        return max(self.weight_errors.values(), default=0.0)

    @property
    def exact(self) -> bool:
        return not self.weight_errors

    def __iter__(self):
        return iter((self.model, self.changes))

    def as_dict(self) -> dict:
        return {"changes": list(self.changes), "shifted_tensors": self.shifted_tensors,
                "requantized_weights": len(self.weight_errors), "max_weight_error": self.max_weight_error,
                "exact": self.exact, "io_changes": [dataclasses.asdict(c) for c in self.io_changes],
                "warnings": list(self.warnings)}


class _Graph:
    """Producer/consumer/constant lookups over a ModelProto being edited in place."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.g = model.graph
        self.refresh()

    def refresh(self) -> None:
        g = self.g
        self.inits = {t.name: t for t in g.initializer}
        self.consts = _constants(self.model)
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
        self.inputs = {vi.name for vi in g.input if vi.name not in self.inits}
        self.outputs = {vi.name for vi in g.output}
        self.taken = set(self.producer) | set(self.inits) | self.inputs | {n.name for n in g.node}

    def fresh(self, base: str) -> str:
        k = 0
        while True:
            cand = f"{base}__nafix_{k}"
            if cand not in self.taken:
                self.taken.add(cand)
                return cand
            k += 1

    def add_init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        t = numpy_helper.from_array(np.asarray(value), name)
        self.g.initializer.append(t)
        self.inits[name] = t
        self.consts[name] = np.asarray(value)
        return name

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def qparams(self, node: onnx.NodeProto) -> tuple[np.ndarray | None, np.ndarray | None]:
        s = self.consts.get(node.input[1]) if len(node.input) > 1 else None
        if len(node.input) > 2 and node.input[2]:
            z = self.consts.get(node.input[2])
        else:
            z = None if s is None else np.zeros(np.shape(s), np.uint8)
        return s, z


def convert_uint8_to_int8(model: onnx.ModelProto, *, io: str = "keep", requantize_weights: bool = True,
                          model_name: str = "the model") -> Uint8Conversion:
    """Make every interior activation int8 exactly, and (by default) every weight int8 symmetric per channel.

    Activations: each uint8 QuantizeLinear/DequantizeLinear pair gets zero-point ``zp - 128`` with the
    same scale, and the tensors between them (through data movement, MaxPool, ...) become int8: the
    int8 value is the uint8 value minus 128, so every dequantized value is unchanged and outputs are
    bit-identical. ``io="keep"`` (default) keeps uint8 graph edges (stedgeai converts them with
    ``--input-data-type`` / ``--output-data-type``): a uint8 input read directly by
    DequantizeLinear stays as it is, one read through data movement gets an exact
    DequantizeLinear -> QuantizeLinear(int8) right after it, a uint8 output written by anything but
    a QuantizeLinear gets the reverse conversion. ``io="int8"`` makes those edges int8 too (the
    caller feeds ``x - 128``; recorded in ``io_changes``).

    Weights: uint8 (or asymmetric int8) weights of Conv/ConvTranspose/Gemm/MatMul and PRelu slopes
    are re-quantized to symmetric int8 per output channel (scale = max|w| / 127 per channel, the
    arithmetic of onnxruntime's symmetric weight quantization on the already dequantized weight),
    and the int32 bias of the same node to ``input_scale * weight_scale``. This changes numerics
    slightly: ``weight_errors`` gives the max abs weight error per tensor. With
    ``requantize_weights=False`` uint8 weights are shifted exactly like activations instead (an
    asymmetric int8 weight the NPU still rejects, but a bit-exact model). Other uint8 constants
    (e.g. an Add operand) are always shifted exactly.
    """
    if io not in ("keep", "int8"):
        raise UsageError(f"the uint8 interface mode must be keep or int8, not '{io}'.")
    from .rewriters import IoChange

    m = _copy(model)
    _unique_names(m)
    gr = _Graph(m)
    types = _tensor_types(m)
    changes: list[str] = []
    warnings: list[str] = []
    io_changes: list = []
    weight_errors: dict[str, float] = {}

    # --- 1. find the uint8 activation region ---------------------------------------------------
    region: set[str] = set()  # tensors whose uint8 values become int8 (value - 128)
    dq_in: set[str] = set()  # DequantizeLinear nodes reading the region
    q_out: set[str] = set()  # QuantizeLinear nodes writing the region
    stack: list[str] = []
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and not gr.is_const(n.input[0]):
            _, z = gr.qparams(n)
            if z is not None and z.dtype == np.uint8:
                stack.append(n.output[0])
    u8_inputs = [name for name in gr.inputs if types.get(name) == TensorProto.UINT8]
    kept_inputs: set[str] = set()
    input_bridges: dict[str, str] = {}
    for name in u8_inputs:
        if not _reaches_dequantize(gr, name):
            continue  # a uint8 input that is not quantized data (e.g. indices); leave it
        direct = all(c.op_type == "DequantizeLinear" for c in gr.consumers[name])
        if io == "keep" and direct:
            kept_inputs.add(name)
            continue
        if io == "keep":
            input_bridges[name] = ""  # filled below once the region is known
        stack.append(name)
    while stack:
        t = stack.pop()
        if t in region:
            continue
        region.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                if c.input[0] == t:
                    dq_in.add(c.name)
                continue
            if c.op_type in EXACT_SHIFT_OPS and c.input[0] == t or (c.op_type == "Concat"):
                if c.op_type == "Resize" and (_attr(c, "mode", b"nearest") not in (b"nearest", "nearest")):
                    raise UsageError(f"{model_name}: '{c.name}' (Resize, {_attr(c, 'mode')!r}) interpolates uint8 "
                                     "values; nafix can shift uint8 to int8 exactly only through data movement.")
                stack.extend(o for o in c.output if o)
                continue
            raise UsageError(f"{model_name}: '{c.name}' ({c.op_type}) computes on the uint8 tensor '{t}'; nafix "
                             "converts uint8 activations exactly only in QDQ models where uint8 tensors pass "
                             "between QuantizeLinear and DequantizeLinear through data movement.")
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.output[0] in region:
            q_out.add(n.name)
    u8_weights = _uint8_or_asym_weights(gr)
    shift_consts = _uint8_plain_constants(gr, exclude={w for w, _ in u8_weights} if requantize_weights else set())
    if not region and not u8_weights and not shift_consts:
        return Uint8Conversion(m, [], warnings=["the model has no uint8 tensor"])

    # --- 2. keep-mode interface: bridges at uint8 inputs and outputs ----------------------------
    kept_outputs: set[str] = set()
    bridges: set[str] = set()  # nodes nafix adds at kept uint8 edges (already int8 on the inside)
    if io == "keep":
        for name in list(input_bridges):
            s, z, axis = _first_dq_params(gr, name, model_name)
            new = gr.fresh(name + "_int8")
            for c in list(gr.consumers[name]):
                for k, i in enumerate(c.input):
                    if i == name:
                        c.input[k] = new
            dq_out = gr.fresh(name + "_dequantized")
            s_name = gr.add_init(name + "_scale", s)
            z_name = gr.add_init(name + "_zero_point", z)
            z8_name = gr.add_init(name + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            attrs = {"axis": axis} if axis is not None else {}
            dq = helper.make_node("DequantizeLinear", [name, s_name, z_name], [dq_out], name=gr.fresh(name + "_DequantizeLinear"), **attrs)
            q = helper.make_node("QuantizeLinear", [dq_out, s_name, z8_name], [new], name=gr.fresh(name + "_QuantizeLinear"), **attrs)
            m.graph.node.insert(0, q)
            m.graph.node.insert(0, dq)
            bridges.update((q.name, dq.name))
            region.discard(name)
            region.add(new)
            types[new] = TensorProto.INT8
            input_bridges[name] = new
            changes.append(f"uint8 input '{name}' kept; an exact DequantizeLinear -> QuantizeLinear(int8) "
                           f"bridge feeds its data-movement consumers")
        for out in list(gr.outputs):
            if out not in region:
                continue
            p = gr.producer.get(out)
            if p is not None and p.name in q_out:
                q_out.discard(p.name)  # a QuantizeLinear writing the output directly keeps uint8
                region.discard(out)
                kept_outputs.add(out)
                continue
            s, z, axis = _last_q_params(gr, out, model_name)
            inner = gr.fresh(out + "_int8")
            for k, o in enumerate(p.output):
                if o == out:
                    p.output[k] = inner
            for c in gr.consumers[out]:
                for k, i in enumerate(c.input):
                    if i == out:
                        c.input[k] = inner
            region.discard(out)
            region.add(inner)
            s_name = gr.add_init(out + "_scale", s)
            z_name = gr.add_init(out + "_zero_point", z)
            z8_name = gr.add_init(out + "_zero_point_int8", (z.astype(np.int16) - 128).astype(np.int8))
            deq = gr.fresh(out + "_dequantized")
            attrs = {"axis": axis} if axis is not None else {}
            bdq = helper.make_node("DequantizeLinear", [inner, s_name, z8_name], [deq],
                                   name=gr.fresh(out + "_DequantizeLinear"), **attrs)
            bq = helper.make_node("QuantizeLinear", [deq, s_name, z_name], [out],
                                  name=gr.fresh(out + "_QuantizeLinear"), **attrs)
            m.graph.node.extend([bdq, bq])
            bridges.update((bdq.name, bq.name))
            changes.append(f"uint8 output '{out}' kept; an exact DequantizeLinear -> QuantizeLinear(uint8) bridge writes it")
        gr.refresh()
        dq_in = {n.name for n in m.graph.node
                 if n.op_type == "DequantizeLinear" and n.input[0] in region and n.name not in bridges}
        q_out = {n.name for n in m.graph.node
                 if n.op_type == "QuantizeLinear" and n.output[0] in region and n.name not in bridges}

    if io == "int8":  # recorded before the zero-points below are shifted
        for name in u8_inputs:
            if name in region:
                s, z, _ = _first_dq_params(gr, name, model_name)
                io_changes.append(IoChange("input", name, "int8", _scalar_or_list(s),
                                           _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))
        for out in gr.outputs:
            if out in region:
                s, z, _ = _last_q_params(gr, out, model_name)
                io_changes.append(IoChange("output", out, "int8", _scalar_or_list(s),
                                           _scalar_or_list(z.astype(np.int16) - 128), was="uint8"))

    # --- 3. shift zero-points of the region's Q/DQ ----------------------------------------------
    zp_cache: dict[tuple[str, int], str] = {}

    def shifted_zp(node: onnx.NodeProto) -> str:
        s, z = gr.qparams(node)
        key = (node.input[2] if len(node.input) > 2 else "", int(np.size(s)))
        if key not in zp_cache:
            if z.dtype != np.uint8:
                raise UsageError(f"{model_name}: '{node.name}' mixes a uint8 tensor with a {z.dtype.name} zero-point.")
            zp_cache[key] = gr.add_init((key[0] or node.name) + "_int8", (z.astype(np.int16) - 128).astype(np.int8))
        return zp_cache[key]

    for n in m.graph.node:
        if n.name in dq_in or n.name in q_out:
            z_name = shifted_zp(n)
            while len(n.input) < 3:
                n.input.append("")
            n.input[2] = z_name
    for n in m.graph.node:  # Pad's constant value in the region shifts too
        if n.op_type == "Pad" and n.input[0] in region and len(n.input) > 2 and n.input[2]:
            v = gr.consts.get(n.input[2])
            if v is not None and v.dtype == np.uint8:
                n.input[2] = gr.add_init(n.input[2] + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
    shifted = {t for t in region}
    _retype(m, shifted, TensorProto.INT8)
    n_q, n_dq = len(q_out), len(dq_in)
    if region:
        changes.append(f"{len(region)} uint8 activation tensor(s) made int8 exactly (zero-point - 128, same scale) "
                       f"across {n_q} QuantizeLinear and {n_dq} DequantizeLinear")

    # --- 4. constants: exact shift or symmetric per-channel re-quantization ---------------------
    u8_weight_names = {w for w, _ in u8_weights}
    plain = [c for c in shift_consts if c not in u8_weight_names]
    for name in shift_consts:
        v = gr.consts[name]
        new_v = gr.add_init(name + "_int8", (v.astype(np.int16) - 128).astype(np.int8))
        for dq in [c for c in gr.consumers[name] if c.op_type == "DequantizeLinear" and c.input[0] == name]:
            z_name = shifted_zp(dq)
            dq.input[0] = new_v
            while len(dq.input) < 3:
                dq.input.append("")
            dq.input[2] = z_name
    if plain:
        changes.append(f"{len(plain)} uint8 constant(s) read by DequantizeLinear shifted to int8 exactly")
    if requantize_weights:
        per_channel_ok = _opset(m) >= MIN_PER_CHANNEL_OPSET
        if not per_channel_ok and u8_weights:
            warnings.append(f"opset {_opset(m)} has no per-axis DequantizeLinear: weights re-quantized per tensor")
        for wname, dq in u8_weights:
            err = _requantize_weight(gr, wname, dq, per_channel_ok, warnings, model_name)
            if err is not None:
                weight_errors[wname] = err
        if weight_errors:
            worst = max(weight_errors, key=weight_errors.get)
            changes.append(f"{len(weight_errors)} weight tensor(s) re-quantized to int8 symmetric per channel "
                           f"(max abs weight error {weight_errors[worst]:.3g}, in '{worst}')")
    else:
        n_u8 = sum(1 for w, _ in u8_weights if gr.consts[w].dtype == np.uint8)
        if u8_weights:
            changes.append(f"{n_u8} uint8 weight tensor(s) shifted to int8 exactly; {len(u8_weights)} weight(s) stay "
                           "asymmetric, which the NPU rejects (re-run with weight re-quantization)")
    _remove_dead(m)
    _clamp_ir(m)
    return Uint8Conversion(m, changes, io_changes, weight_errors, len(shifted), warnings)


def _scalar_or_list(v):
    a = np.asarray(v)
    return a.reshape(-1)[0].item() if a.size == 1 else a.reshape(-1).tolist()


def _tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        inferred = model
    out = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        if vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    for t in inferred.graph.initializer:
        out[t.name] = t.data_type
    for n in inferred.graph.node:  # QuantizeLinear outputs carry the zero-point's type
        if n.op_type == "QuantizeLinear" and n.output[0] not in out:
            out[n.output[0]] = TensorProto.UINT8 if len(n.input) < 3 or not n.input[2] else out.get(n.input[2], 0)
    return out


def _reaches_dequantize(gr: _Graph, name: str) -> bool:
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                return True
            if c.op_type in EXACT_SHIFT_OPS:
                stack.extend(o for o in c.output if o)
    return False


def _first_dq_params(gr: _Graph, name: str, model_name: str):
    """(scale, zero-point, axis) of the DequantizeLinear(s) reached from ``name`` through data movement."""
    found = []
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for c in gr.consumers[t]:
            if c.op_type == "DequantizeLinear":
                s, z = gr.qparams(c)
                found.append((s, z, _attr(c, "axis") if np.size(s) > 1 else None))
            elif c.op_type in EXACT_SHIFT_OPS:
                stack.extend(o for o in c.output if o)
    return _agree(found, name, model_name)


def _last_q_params(gr: _Graph, name: str, model_name: str):
    """(scale, zero-point, axis) of the QuantizeLinear(s) that produced ``name`` (through data movement)."""
    found = []
    stack, seen = [name], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        p = gr.producer.get(t)
        if p is None:
            continue
        if p.op_type == "QuantizeLinear":
            s, z = gr.qparams(p)
            found.append((s, z, _attr(p, "axis") if np.size(s) > 1 else None))
        elif p.op_type in EXACT_SHIFT_OPS:
            stack.extend(i for i in p.input[:1] if i) if p.op_type != "Concat" else stack.extend(p.input)
    return _agree(found, name, model_name)


def _agree(found, name: str, model_name: str):
    if not found:
        raise UsageError(f"{model_name}: the uint8 tensor '{name}' reaches no QuantizeLinear/DequantizeLinear, so its "
                         "scale and zero-point are unknown.")
    s0, z0, a0 = found[0]
    for s, z, a in found[1:]:
        if not (np.array_equal(s, s0) and np.array_equal(z, z0) and a == a0):
            raise UsageError(f"{model_name}: the uint8 tensor '{name}' is read with different scales or zero-points; "
                             "nafix cannot pick one to convert it with.")
    return np.asarray(s0), np.asarray(z0), a0


def _uint8_or_asym_weights(gr: _Graph) -> list[tuple[str, onnx.NodeProto]]:
    """(constant, its DequantizeLinear) for weights the NPU rejects: uint8, or int8 with a non-zero zero-point."""
    out = []
    seen = set()
    for n in gr.g.node:
        if n.op_type not in WEIGHT_OPS or len(n.input) < 2:
            continue
        dq = gr.producer.get(n.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or not gr.is_const(dq.input[0]) or dq.name in seen:
            continue
        v = gr.consts[dq.input[0]]
        _, z = gr.qparams(dq)
        if v.dtype == np.uint8 or (v.dtype == np.int8 and z is not None and np.any(z != 0)):
            out.append((dq.input[0], dq))
            seen.add(dq.name)
    return out


def _uint8_plain_constants(gr: _Graph, exclude: set[str]) -> list[str]:
    """uint8 constants read by DequantizeLinear that are not weights to re-quantize (shifted exactly)."""
    out = []
    for name, v in gr.consts.items():
        if v.dtype != np.uint8 or name in exclude:
            continue
        if any(c.op_type == "DequantizeLinear" and c.input[0] == name for c in gr.consumers[name]):
            out.append(name)
    return sorted(out)


def _requantize_weight(gr: _Graph, wname: str, dq: onnx.NodeProto, per_channel_ok: bool,
                       warnings: list[str], model_name: str) -> float | None:
    """Re-quantize one weight to int8 symmetric per channel (arithmetic on the dequantized values)."""
    q = gr.consts[wname]
    s, z = gr.qparams(dq)
    axis_attr = _attr(dq, "axis", 1)
    w = _dequantize(q, s, z, axis_attr)
    users = [c for c in gr.consumers[dq.output[0]]]
    axes = {(_weight_axis(c, q.ndim) if c.op_type in WEIGHT_OPS and list(c.input[1:2]) == [dq.output[0]] else None)
            for c in users}
    axis = axes.pop() if len(axes) == 1 else None
    if not per_channel_ok or q.ndim == 0:
        axis = None
    if axis is None:
        amax = np.abs(w).max() if w.size else 0.0
        scale = np.asarray(amax / 127.0 if amax > 0 else 1.0, np.float32)
        new_q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        if q.ndim and q.shape[0] > 1 and per_channel_ok:
            warnings.append(f"the weight '{wname}' is read in a way that has no single output-channel axis; "
                            "re-quantized per tensor")
    else:
        red = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.abs(w).max(axis=red) if w.size else np.zeros(w.shape[axis])
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        shape = [1] * w.ndim
        shape[axis] = -1
        new_q = np.clip(np.rint(w / scale.reshape(shape)), -127, 127).astype(np.int8)
    new_w = _dequantize(new_q, scale, np.zeros(scale.shape, np.int8), axis if axis is not None else 1)
    err = float(np.abs(new_w.astype(np.float64) - w.astype(np.float64)).max()) if w.size else 0.0
    dq.input[0] = gr.add_init(wname + "_int8sym", new_q)
    dq.input[1] = gr.add_init(dq.input[1] + "_int8sym", scale)
    while len(dq.input) < 3:
        dq.input.append("")
    dq.input[2] = gr.add_init(wname + "_zero_point_int8sym", np.zeros(scale.shape, np.int8))
    if axis is not None:
        _set_attr(dq, "axis", int(axis))
    for c in users:
        if c.op_type in ("Conv", "ConvTranspose", "Gemm") and len(c.input) > 2 and c.input[2]:
            _requantize_bias(gr, c, scale, axis, warnings)
    return err


def _dequantize(q: np.ndarray, s, z, axis) -> np.ndarray:
    s = np.asarray(s, np.float32)
    z = np.asarray(z)
    qf = q.astype(np.float32)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[axis if axis >= 0 else axis + q.ndim] = -1
        return ((qf - z.astype(np.float32).reshape(shape)) * s.reshape(shape)).astype(np.float32)
    return ((qf - np.float32(z.reshape(-1)[0] if z.size else 0)) * np.float32(s.reshape(-1)[0])).astype(np.float32)


def _requantize_bias(gr: _Graph, node: onnx.NodeProto, w_scale: np.ndarray, axis, warnings: list[str]) -> None:
    """Re-express the int32 bias of ``node`` with scale ``input_scale * weight_scale`` (per channel)."""
    bdq = gr.producer.get(node.input[2])
    if bdq is None or bdq.op_type != "DequantizeLinear" or not gr.is_const(bdq.input[0]):
        return
    xdq = gr.producer.get(node.input[0])
    if xdq is None or xdq.op_type != "DequantizeLinear":
        warnings.append(f"the bias of '{node.name}' kept its scale: the input scale of the node is unknown")
        return
    xs, _ = gr.qparams(xdq)
    if xs is None or np.size(xs) != 1:
        return
    bq = gr.consts[bdq.input[0]]
    bs, bz = gr.qparams(bdq)
    b = _dequantize(bq, bs, bz, _attr(bdq, "axis", 0)).astype(np.float64)
    new_s = (np.float32(xs.reshape(-1)[0]) * w_scale.astype(np.float32)).astype(np.float32).reshape(-1)
    if new_s.size == 1 and b.size > 1:
        new_s_b = np.full(b.shape, new_s[0], np.float32)
    else:
        new_s_b = new_s
    new_bq = np.clip(np.rint(b / new_s_b), -2**31, 2**31 - 1).astype(np.int32)
    bdq.input[0] = gr.add_init(bdq.input[0] + "_int8sym", new_bq)
    bdq.input[1] = gr.add_init(bdq.input[1] + "_int8sym", new_s if new_s.size > 1 else new_s.reshape(()))
    while len(bdq.input) < 3:
        bdq.input.append("")
    bdq.input[2] = gr.add_init(bdq.input[0] + "_zero_point", np.zeros(new_s.shape if new_s.size > 1 else (), np.int32))
    if new_s.size > 1:
        _set_attr(bdq, "axis", 0)


def _retype(model: onnx.ModelProto, names: set[str], elem: int) -> None:
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.name in names:
            vi.type.tensor_type.elem_type = elem


# ================================================================================================
# 4. Float islands of a QDQ model
# ================================================================================================


@dataclass
class IslandResult:
    """What :func:`requantize_islands` did.

    ``calibration``: ``random`` | ``npz`` | ``images``, or ``none`` when no island needed
    onnxruntime (nothing to do, or only data movement that takes its input's parameters);
    ``quantized_nodes``: the island nodes quantized; ``remaining``: float islands left
    (:func:`float_islands`); ``preserved``: existing QuantizeLinear/DequantizeLinear nodes whose
    scale and zero-point are unchanged; ``changed_params``: those that changed (should be empty);
    ``problems``: what :func:`check_npu_quantization` still rejects.
    """

    model: onnx.ModelProto
    calibration: str
    samples: int
    quantized_nodes: list[str] = field(default_factory=list)
    remaining: list[dict] = field(default_factory=list)
    preserved: int = 0
    changed_params: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"calibration": self.calibration, "samples": self.samples, "quantized_nodes": list(self.quantized_nodes),
                "remaining": list(self.remaining), "preserved": self.preserved,
                "changed_params": list(self.changed_params), "changes": list(self.changes),
                "warnings": list(self.warnings), "problems": list(self.problems)}


def island_nodes(model: onnx.ModelProto, *, profile=None, exclude: Sequence[str] = ()) -> list[str]:
    """Names of the nodes of a QDQ model that run in float only because they are not quantized.

    From nafix's placement: SW nodes (not Q/DQ) failing ``quantized_activations``,
    ``params_quantized`` or ``prelu_slope_quantized``, and SW ops with an int8 kernel that run the
    float kernel; restricted to op types onnxruntime can quantize (:func:`npu_op_types`).
    """
    from .api import analyze_model

    profile = _load_profile(profile)
    op_types, _ = npu_op_types(profile)
    ops = set(op_types)
    analysis = analyze_model(_analysis_copy(model), profile=profile)
    out = []
    for p in analysis.placement.nodes:
        if p.unit != "SW" or p.op_type in ("QuantizeLinear", "DequantizeLinear") or p.name in exclude:
            continue
        if p.op_type not in ops:
            continue
        quant = any(r.constraint in _QUANT_REASONS for r in p.reasons)
        int8_kernel_unused = p.op_type in profile.sw_int8_kernels and p.kernel == "float"
        if quant or int8_kernel_unused:
            out.append(p.name)
    return out


def requantize_islands(model: onnx.ModelProto, *, calib: CalibrationOptions, progress: Progress | None = None,
                       nodes_to_exclude: Sequence[str] = (), tensor_overrides: Mapping[str, list[dict]] | None = None,
                       profile=None, model_name: str = "the model") -> IslandResult:
    """Quantize the float islands of a QDQ model with onnxruntime, keeping every existing scale and zero-point.

    Only the island nodes (:func:`island_nodes`) go to ``quantize_static`` (``nodes_to_quantize``);
    their inputs that already come from a DequantizeLinear are left alone by onnxruntime, and a
    tensor that already has a QuantizeLinear gets that QuantizeLinear's scale and zero-point through
    ``TensorQuantOverrides`` - calibration decides only for tensors that had none, and float
    constants (PRelu slopes int8 symmetric per channel, weights per channel). The redundant
    ``Q -> DQ -> Q`` chains this leaves (identical parameters, an exact identity on int8 values)
    are collapsed, so every original Q/DQ node keeps its name, inputs and parameters; this is
    checked (``preserved`` / ``changed_params``).
    """
    if not _is_quantized(model):
        raise UsageError(f"{model_name}: the model is not quantized at all; quantize it with quantize_float_model "
                         "(nafix --quantize) instead of fixing float islands.")
    m = _copy(model)
    _unique_names(m)
    changes: list[str] = []
    warnings: list[str] = []
    dropped = _strip_initializer_inputs(m)
    if dropped:
        changes.append(f"{len(dropped)} initializer(s) listed as graph inputs ({', '.join(dropped[:3])}"
                       f"{', ...' if len(dropped) > 3 else ''}) made plain constants so they can be quantized")
    u8 = [p for p in check_npu_quantization(m, allow_uint8_io=True) if "uint8" in p]
    if u8:
        raise UsageError(f"{model_name}: the model has uint8 activations ({u8[0]}); convert them to int8 first "
                         "(convert_uint8_to_int8).")
    known = {n.name for n in m.graph.node}
    unknown = [n for n in nodes_to_exclude if n not in known]
    if unknown:
        raise UsageError(f"{model_name}: no node named {', '.join(repr(u) for u in unknown[:3])} to exclude from quantization.")
    profile = _load_profile(profile)
    islands = island_nodes(m, profile=profile, exclude=nodes_to_exclude)
    source_kind = "none"
    if not islands:
        _clamp_ir(m)
        return IslandResult(m, source_kind, 0, [], float_islands(m, profile=profile), 0, [], changes,
                            ["the model has no float island onnxruntime can quantize"])
    source = open_calibration(m, calib, model_name=model_name)
    warnings.extend(source.warnings)
    if source.kind == "random":
        warnings.append("calibrated on random data: the new ranges (island tensors without a QuantizeLinear) "
                        "do not reflect real inputs")
    gr = _Graph(m)
    original_qdq = {n.name: _qdq_signature(gr, n) for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    shared = _share_input_params(m, islands)
    if shared:
        changes.append(f"{len(shared)} data-movement island node(s) ({', '.join(sorted({_op_of(m, n) for n in shared}))}) "
                       "got QuantizeLinear/DequantizeLinear with the parameters of their already quantized input "
                       "(what onnxruntime gives such ops; its quantizer cannot share parameters with a tensor "
                       "that is already dequantized)")
    ort_islands = [n for n in islands if n not in shared]
    if not ort_islands:
        return _island_result(m, m, "none", 0, islands, original_qdq, changes, warnings, profile, 0)
    islands_for_ort = ort_islands
    island_set = set(ort_islands)
    touched: set[str] = set()
    for n in m.graph.node:
        if n.name in island_set:
            touched.update(i for i in n.input if i)
            touched.update(o for o in n.output if o)
    renamed = _rename_collisions(m, touched)
    gr.refresh()
    overrides: dict[str, list[dict]] = {}
    for t in sorted(touched):
        qs = [c for c in gr.consumers[t] if c.op_type == "QuantizeLinear"]
        if not qs:
            continue
        s, z = gr.qparams(qs[0])
        if s is None or z is None or np.size(s) != 1:
            continue
        if len(qs) > 1 and any(not np.array_equal(gr.qparams(q)[0], s) or not np.array_equal(gr.qparams(q)[1], z) for q in qs[1:]):
            warnings.append(f"the tensor '{t}' is quantized twice with different parameters; the first is kept")
        if z.dtype != np.int8:
            continue
        overrides[t] = [{"scale": np.array(s.reshape(-1)[0], np.float32), "zero_point": np.array(z.reshape(-1)[0], np.int8)}]
    shared_ops = _ort_shared_param_ops()
    for n in m.graph.node:  # a data-movement island takes the parameters its output already has
        if n.name in island_set and n.op_type in shared_ops and n.input and n.input[0] not in overrides:
            known = [overrides[o] for o in n.output if o in overrides]
            src = gr.producer.get(n.input[0])
            if known and (src is None or src.op_type != "DequantizeLinear"):
                overrides[n.input[0]] = known[0]
    overrides.update(_prelu_slope_overrides(m, island_set))
    overrides.update(_grouped_conv_transpose_overrides(m, island_set))
    overrides.update({k: list(v) for k, v in (tensor_overrides or {}).items()})
    op_types, _ = npu_op_types(profile)
    reader = _reader(source, progress)
    log.info("quantizing %d float island node(s) of %s with onnxruntime on %s", len(islands_for_ort), model_name,
             source.description)
    producer = (m.producer_name, m.producer_version)
    out = _run_quantize_static(m, reader, op_types=op_types, method=calib.method, nodes_to_quantize=islands_for_ort,
                               overrides=overrides, keep_activations=True, model_name=model_name)
    out.producer_name, out.producer_version = producer
    collapsed = _collapse_requantize_chains(out)
    _remove_dead(out)
    _rename_back(out, renamed)
    return _island_result(m, out, source.kind, reader.done, islands, original_qdq, changes, warnings, profile,
                          collapsed, model_name=model_name)


def _island_result(before: onnx.ModelProto, out: onnx.ModelProto, kind: str, samples: int, islands: list[str],
                   original_qdq: dict, changes: list[str], warnings: list[str], profile, collapsed: int,
                   model_name: str = "the model") -> IslandResult:
    _clamp_ir(out)
    _check_interface(before, out, model_name)
    island_set = set(islands)
    gr2 = _Graph(out)
    preserved, changed = 0, []
    by_name = {n.name: n for n in out.graph.node}
    for name, sig in original_qdq.items():
        n = by_name.get(name)
        if n is None:
            changed.append(f"'{name}' disappeared")
            continue
        if _qdq_signature(gr2, n) == sig:
            preserved += 1
        else:
            changed.append(f"'{name}' changed its scale or zero-point")
    remaining = float_islands(out, profile=profile)
    problems = check_npu_quantization(out, allow_uint8_io=True)
    changes.append(f"{len(islands)} float island node(s) quantized "
                   f"({', '.join(sorted({n.op_type for n in out.graph.node if n.name in island_set}))}); "
                   f"{preserved} existing QuantizeLinear/DequantizeLinear kept their parameters"
                   + (f", {collapsed} redundant re-quantization(s) collapsed" if collapsed else ""))
    return IslandResult(out, kind, samples, islands, remaining, preserved, changed, changes, warnings, problems)


def _op_of(model: onnx.ModelProto, name: str) -> str:
    return next((n.op_type for n in model.graph.node if n.name == name), "?")


def _ort_shared_param_ops() -> frozenset[str]:
    """Op types whose onnxruntime QDQ handler gives the output the input's quantization parameters."""
    from onnxruntime.quantization.operators.direct_q8 import QDQDirect8BitOp
    from onnxruntime.quantization.operators.gather import QDQGather
    from onnxruntime.quantization.operators.pad import QDQPad
    from onnxruntime.quantization.operators.split import QDQSplit
    from onnxruntime.quantization.registry import QDQRegistry

    return frozenset(op for op, cls in QDQRegistry.items()
                     if isinstance(cls, type) and issubclass(cls, (QDQDirect8BitOp, QDQGather, QDQPad, QDQSplit)))


def _share_input_params(model: onnx.ModelProto, islands: list[str]) -> list[str]:
    """For island data-movement ops reading a DequantizeLinear directly: quantize each float output with
    the parameters of that DequantizeLinear (or of the QuantizeLinear the output already has) - what
    onnxruntime's parameter sharing produces, done here because its quantizer loops forever when the
    shared input is an already dequantized tensor. Returns the nodes handled."""
    shared_ops = _ort_shared_param_ops()
    island_set = set(islands)
    done: list[str] = []
    gr = _Graph(model)
    for node in list(model.graph.node):
        if node.name not in island_set or node.op_type not in shared_ops or not node.input:
            continue
        dq = gr.producer.get(node.input[0])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        s, z = gr.qparams(dq)
        if s is None or z is None or np.size(s) != 1:
            continue
        for o in [o for o in node.output if o]:
            qs = [c for c in gr.consumers[o] if c.op_type == "QuantizeLinear"]
            others = [c for c in gr.consumers[o] if c.op_type != "QuantizeLinear"]
            if qs and not others and o not in gr.outputs:
                continue
            src = qs[0] if qs else dq
            s_name, z_name = src.input[1], src.input[2] if len(src.input) > 2 else ""
            q_out, dq_out = gr.fresh(o + "_QuantizeLinear_Output"), gr.fresh(o + "_DequantizeLinear_Output")
            pre = o
            if o in gr.outputs:  # keep the graph output's name on the DequantizeLinear
                pre = gr.fresh(o + "_QuantizeLinear_Input")
                node.output[list(node.output).index(o)] = pre
                dq_out = o
            for c in others:
                for k, i in enumerate(c.input):
                    if i == o:
                        c.input[k] = dq_out
            qn = helper.make_node("QuantizeLinear", [pre, s_name, z_name], [q_out], name=gr.fresh(o + "_QuantizeLinear"))
            dqn = helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out],
                                   name=gr.fresh(o + "_DequantizeLinear"))
            idx = list(model.graph.node).index(node) + 1
            model.graph.node.insert(idx, dqn)
            model.graph.node.insert(idx, qn)
            if o in gr.outputs:
                for q in qs:
                    q.input[0] = pre
        done.append(node.name)
        gr.refresh()
    return done


def _qdq_signature(gr: _Graph, node: onnx.NodeProto) -> tuple:
    s, z = gr.qparams(node)
    return (node.op_type,
            None if s is None else (str(s.dtype), tuple(np.asarray(s).reshape(-1).tolist())),
            None if z is None else (str(z.dtype), tuple(np.asarray(z).reshape(-1).tolist())),
            _attr(node, "axis", 1) if s is not None and np.size(s) > 1 else None)


_ORIG_SUFFIX = "__nafix_orig"


def _rename_collisions(model: onnx.ModelProto, touched: set[str]) -> dict[str, str]:
    """Rename existing names onnxruntime would generate for ``touched`` tensors (``<t>_QuantizeLinear``,
    ``<t>_scale``, ...), so its new nodes do not clash with the model's; returns {new: old}."""
    g = model.graph
    io = {vi.name for vi in g.input} | {vi.name for vi in g.output}
    prefixes = tuple(t + "_" for t in touched)

    def clashes(name: str) -> bool:
        return bool(name) and name not in io and name.startswith(prefixes)

    mapping: dict[str, str] = {}
    tensors = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    for name in sorted(tensors):
        if clashes(name):
            mapping[name] = name + _ORIG_SUFFIX
    _apply_tensor_renames(model, mapping)
    renamed = {v: k for k, v in mapping.items()}
    for n in g.node:
        if clashes(n.name):
            renamed[n.name + _ORIG_SUFFIX] = n.name
            n.name = n.name + _ORIG_SUFFIX
    return renamed


def _apply_tensor_renames(model: onnx.ModelProto, mapping: Mapping[str, str]) -> None:
    if not mapping:
        return
    g = model.graph
    for t in g.initializer:
        if t.name in mapping:
            t.name = mapping[t.name]
    for n in g.node:
        for k, i in enumerate(n.input):
            if i in mapping:
                n.input[k] = mapping[i]
        for k, o in enumerate(n.output):
            if o in mapping:
                n.output[k] = mapping[o]
    for vi in g.value_info:
        if vi.name in mapping:
            vi.name = mapping[vi.name]


def _rename_back(model: onnx.ModelProto, renamed: Mapping[str, str]) -> None:
    """Give renamed tensors and nodes their original names again where nothing took them meanwhile."""
    g = model.graph
    taken_t = {t.name for t in g.initializer} | {o for n in g.node for o in n.output} | {i.name for i in g.input}
    taken_n = {n.name for n in g.node}
    tensor_map = {new: old for new, old in renamed.items() if new in taken_t and old not in taken_t}
    _apply_tensor_renames(model, tensor_map)
    for n in g.node:
        old = renamed.get(n.name)
        if old is not None and old not in taken_n:
            taken_n.discard(n.name)
            n.name = old
            taken_n.add(old)


def _collapse_requantize_chains(model: onnx.ModelProto) -> int:
    """``Q2 -> DQ -> Q`` with identical parameters: Q reads Q2's input directly (exact on int8 values)."""
    gr = _Graph(model)
    count = 0
    for q in model.graph.node:
        if q.op_type != "QuantizeLinear":
            continue
        dq = gr.producer.get(q.input[0])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q2 = gr.producer.get(dq.input[0])
        if q2 is None or q2.op_type != "QuantizeLinear":
            continue
        sig = _qdq_signature(gr, q)[1:]
        if _qdq_signature(gr, dq)[1:] == sig and _qdq_signature(gr, q2)[1:] == sig:
            q.input[0] = q2.input[0]
            count += 1
    if count:
        gr.refresh()
    return count


# ================================================================================================
# 5. Accuracy
# ================================================================================================


@dataclass
class QuantAccuracy:
    """Float vs quantized: per output ``{name, cosine, snr_db, max_abs_error}``, and the ``worst_tensors``
    ``{tensor, sqnr_db}`` (lowest SQNR of the quantized model's activations against the float
    model's, from ``onnxruntime.quantization.qdq_loss_debug``)."""

    calibration: str
    outputs: list[dict]
    worst_tensors: list[dict]
    samples: int = 0

    def as_dict(self) -> dict:
        return {"calibration": self.calibration, "samples": self.samples, "outputs": list(self.outputs),
                "worst_tensors": list(self.worst_tensors)}


def _session(model: onnx.ModelProto):
    from .verify import session

    return session(model)


def accuracy_report(float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                    feeds: Sequence[Mapping[str, np.ndarray]], *, calibration: str = "random", worst: int = 10,
                    debug_samples: int = 4) -> QuantAccuracy:
    """Compare a quantized model with its float reference on ``feeds``.

    Outputs (matched by name; integer outputs are compared as their values): cosine similarity,
    SNR in dB (``10 log10(sum ref^2 / sum err^2)``, ``inf`` when identical) and max abs error over
    all feeds. ``worst_tensors``: the ``worst`` activations with the lowest SQNR (20 log10 of the
    norm ratio, onnxruntime's ``compute_signal_to_quantization_noice_ratio``) between the float
    model's tensor and the quantized model's dequantized tensor, on the first ``debug_samples``
    feeds (the intermediate tensors of every sample are held in memory).
    """
    if not feeds:
        raise UsageError("the accuracy report needs at least one input sample.")
    s_f, s_q = _session(float_model), _session(quant_model)
    names = [o.name for o in s_f.get_outputs()]
    q_names = {o.name for o in s_q.get_outputs()}
    q_inputs = {i.name for i in s_q.get_inputs()}
    acc: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in names if n in q_names}
    for feed in feeds:
        ref = dict(zip(names, s_f.run(names, dict(feed))))
        got = dict(zip(list(acc), s_q.run(list(acc), {k: v for k, v in feed.items() if k in q_inputs})))
        for n in acc:
            acc[n].append((np.asarray(ref[n]), np.asarray(got[n])))
    outputs = []
    for n in names:
        if n not in acc:
            outputs.append({"name": n, "cosine": None, "snr_db": None, "max_abs_error": None,
                            "detail": "missing from the quantized model"})
            continue
        a = np.concatenate([r.reshape(-1) for r, _ in acc[n]]).astype(np.float64)
        b = np.concatenate([g.reshape(-1) for _, g in acc[n]]).astype(np.float64)
        outputs.append({"name": n, **_compare(a, b)})
    worst_rows = _worst_tensors(float_model, quant_model, list(feeds)[:max(1, debug_samples)], worst) if worst > 0 else []
    return QuantAccuracy(calibration, outputs, worst_rows, len(feeds))


def _compare(a: np.ndarray, b: np.ndarray) -> dict:
    if a.shape != b.shape:
        return {"cosine": 0.0, "snr_db": float("-inf"), "max_abs_error": float("inf"), "detail": "shapes differ"}
    diff = a - b
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cosine = float(np.dot(a, b) / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
    noise = float(np.sum(diff ** 2))
    snr = float("inf") if noise == 0 else float(10 * np.log10(max(float(np.sum(a ** 2)), 1e-30) / noise))
    return {"cosine": cosine, "snr_db": snr, "max_abs_error": float(np.abs(diff).max()) if diff.size else 0.0}


def _worst_tensors(float_model: onnx.ModelProto, quant_model: onnx.ModelProto,
                   feeds: list[Mapping[str, np.ndarray]], worst: int) -> list[dict]:
    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    with tempfile.TemporaryDirectory(prefix="nafix-qdebug-") as tmp:
        fpath, qpath = Path(tmp) / "float.onnx", Path(tmp) / "quant.onnx"
        fa, qa = Path(tmp) / "float_aug.onnx", Path(tmp) / "quant_aug.onnx"
        f_model, q_model = _copy(float_model), _copy(quant_model)
        _clamp_ir(f_model)
        _clamp_ir(q_model)
        onnx.save(f_model, str(fpath))
        onnx.save(q_model, str(qpath))
        try:
            with _quiet_onnxruntime():
                modify_model_output_intermediate_tensors(str(fpath), str(fa))
                modify_model_output_intermediate_tensors(str(qpath), str(qa))
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                so.log_severity_level = 3
                q_in = {i.name for i in q_model.graph.input}
                f_acts = collect_activations(str(fa), _FeedsReader(feeds), session_options=so)
                q_acts = collect_activations(str(qa), _FeedsReader([{k: v for k, v in f.items() if k in q_in}
                                                                    for f in feeds]), session_options=so)
        except Exception as exc:  # noqa: BLE001 - the per-tensor view is a diagnostic, not a gate
            log.info("per-tensor SQNR unavailable: %s", exc)
            return []
    matching = create_activation_matching(q_acts, f_acts)
    matching = {k: v for k, v in matching.items() if v.get("float")}
    if not matching:
        matching = _match_by_qdq(quant_model, q_acts, f_acts)
    if not matching:
        return []
    errors = compute_activation_error(matching)
    rows = [{"tensor": k, "sqnr_db": float(v["xmodel_err"])}
            for k, v in errors.items() if "xmodel_err" in v]
    rows.sort(key=lambda r: r["sqnr_db"])
    return rows[:worst]


def _match_by_qdq(quant_model: onnx.ModelProto, q_acts: dict, f_acts: dict) -> dict:
    """Activation matching for QDQ models that do not follow onnxruntime's tensor naming: for each
    ``t -> QuantizeLinear -> DequantizeLinear -> t'``, pre = ``t``, post = ``t'``, float = ``t`` of
    the float model."""
    gr = _Graph(quant_model)
    out = {}
    for q in quant_model.graph.node:
        if q.op_type != "QuantizeLinear" or q.input[0] not in f_acts or q.input[0] not in q_acts:
            continue
        for dq in gr.consumers[q.output[0]]:
            if dq.op_type == "DequantizeLinear" and dq.output[0] in q_acts:
                out[q.input[0]] = {"pre_qdq": q_acts[q.input[0]], "post_qdq": q_acts[dq.output[0]],
                                   "float": f_acts[q.input[0]]}
                break
    return out


# ================================================================================================
# 6. Zero-point 0 for an already calibrated output (NAF013)
# ================================================================================================


def symmetric_output_params(scale, zero_point, dtype=np.int8) -> tuple[np.ndarray, np.ndarray]:
    """(new_scale, 0): zero-point-0 parameters covering the same real range as ``(scale, zero_point)``.

    The calibrated range is ``[(qmin - zp) * s, (qmax - zp) * s]``; the new scale is the smallest
    with zero-point 0 that still covers it: ``max(hi / qmax, lo / qmin)`` (``qmin=-128``,
    ``qmax=127`` for int8). A zero-point of 0 returns the scale unchanged. This is arithmetic on a
    range that was already calibrated - no data, no new quantizer - used to turn a Conv/Gemm output
    in ST's "scale-offset format" (non-zero zero-point, which blocked HW lowering in a forum log)
    into a symmetric one. The price: with a one-sided range (e.g. after ReLU) half the codes go
    unused, so the resolution halves; verify with a tolerance contract. Works element-wise on arrays.
    """
    info = np.iinfo(np.dtype(dtype))
    if info.min >= 0:
        raise UsageError(f"symmetric output parameters need a signed type, not {np.dtype(dtype).name}.")
    s = np.asarray(scale, dtype=np.float64)
    z = np.asarray(zero_point, dtype=np.float64)
    if np.any(s <= 0) or not np.all(np.isfinite(s)):
        raise UsageError("the scale to make symmetric must be positive and finite.")
    lo = (info.min - z) * s
    hi = (info.max - z) * s
    new = np.maximum(np.maximum(hi, 0.0) / info.max, np.minimum(lo, 0.0) / info.min)
    new32 = new.astype(np.float32)
    new32 = np.where(new32.astype(np.float64) < new, np.nextafter(new32, np.float32(np.inf)), new32)  # cover, not 1 ulp short
    new32 = np.where(z == 0, s.astype(np.float32), new32)
    return np.asarray(new32, dtype=np.float32), np.zeros(np.shape(new32), dtype=np.dtype(dtype))
