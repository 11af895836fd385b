"""Calibration data for onnxruntime's calibrators: folders of ``.npz`` files, one ``.npz`` with a sample
axis, folders of images, or seeded random data, and the readers that feed them.
"""

from __future__ import annotations

import math
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx

from ..errors import InputError, UsageError
from ..randomdata import uniform
from .modelproto import _NP_OF_ELEM

Progress = Callable[[int, int], None]

#: Calibration image types, all decoded by Pillow.
IMAGE_SUFFIXES = (".ppm", ".pgm", ".pnm", ".bmp", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class CalibrationOptions:
    """Where calibration samples come from and how images become model inputs.

    ``path``: a folder of ``.npz`` files (one sample each, arrays keyed by input name, the batch axis
    optional), a single ``.npz`` whose arrays carry a leading sample axis, or a folder of images
    (:data:`IMAGE_SUFFIXES`, decoded by Pillow). ``None``: seeded
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
        for what, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and not all(math.isfinite(float(v)) for v in values):
                raise UsageError(f"the calibration {what} must be finite numbers, not {list(values)}.")
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
        if not p.is_file() and not p.is_dir():
            raise InputError(f"{p}: the calibration data path is not a file or a folder (a FIFO, socket or device).")
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
    for s in specs:
        dyn = [axis for axis, d in enumerate(s.shape) if d is None and axis > 0]
        if dyn:  # random data at 1 there (e.g. a 1x1 image) calibrates nothing sensible, or fails in onnxruntime
            raise UsageError(f"the model input '{s.name}' ({s.describe()}) has dynamic dimension(s) at axis "
                             f"{', '.join(map(str, dyn))}; random calibration needs the real size: pin it with "
                             f"--input-shape {s.name}=" + ",".join(str(d) if d else "N" for d in s.shape)
                             + " (or calibrate from --calib data).")
    ranges = _input_ranges(model, [s.name for s in specs])

    def gen() -> Iterator[dict[str, np.ndarray]]:
        rng = np.random.default_rng(calib.seed)
        for _ in range(calib.random_samples):
            feed = {}
            for s in specs:
                shape = s.concrete_shape()
                if s.dtype.kind == "f":
                    lo, hi = ranges[s.name] or (-1.0, 1.0)
                    feed[s.name] = uniform(rng, lo, hi, shape, s.dtype)
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


def _input_ranges(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[float, float] | None]:
    """:func:`_input_range` of each graph input in ``names`` (the model read once)."""
    from ..graph import read_graph

    inputs = {t.name: t for t in read_graph(model).inputs}
    return {name: _input_range(inputs[name]) if name in inputs else None for name in names}


def _input_range(t) -> tuple[float, float] | None:
    """The float range a QuantizeLinear right after graph input ``t`` (an IR tensor) can represent
    (None: unknown)."""
    from ..graph import qparams

    for node in t.outputs:
        if node.op == "QuantizeLinear" and node.inputs[0] is t:
            s, z = qparams(node)
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
    """The arrays of one calibration .npz, never unpickled (see :func:`fixer.model_io.read_npz`)."""
    from ..model_io import read_npz

    return read_npz(path, "--calib")


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
    if calib.image_size is not None and hw[0] is not None and hw[1] is not None and tuple(size) != tuple(hw):
        raise UsageError(f"{folder}: --calib-size {size[0]}x{size[1]} differs from the model input '{spec.name}' "
                         f"({spec.describe()}, {layout.upper()}), whose height and width are fixed at {hw[0]}x{hw[1]}; "
                         "leave --calib-size out.")
    if size[0] is None or size[1] is None:
        raise UsageError(f"{folder}: the model input '{spec.name}' ({spec.describe()}) has a dynamic height or "
                         "width; give the image size (H, W) to resize calibration images to.")
    return spec, layout, (int(size[0]), int(size[1]))


def read_image(path: str | Path) -> np.ndarray:
    """Decode an image with Pillow into an H x W x C float32 array of 0..255 values (C = 1 or 3, RGB
    order). 16-bit grey images (PNG, PNM with any maxval) are scaled to 0..255."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        raise InputError(f"{p}: unsupported image type '{suffix}' (use {', '.join(IMAGE_SUFFIXES)}).")
    from ..fsutil import read_bytes

    try:
        raw = read_bytes(p)  # a FIFO named *.png is refused, never read
    except OSError as exc:
        raise InputError(f"{p}: the image cannot be read ({exc.strerror or exc}).") from None
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.mode == "I" or im.mode.startswith("I;16"):  # 16-bit PNG/PNM: Pillow gives 0..65535
                img = np.asarray(im, dtype=np.float32) * (255.0 / 65535.0)
            else:
                im = im.convert("L" if im.mode in ("L", "F", "1") else "RGB")
                img = np.asarray(im, dtype=np.float32)
    except Exception as exc:  # noqa: BLE001 - any decoding problem is the file's
        raise InputError(f"{p}: not a readable image ({type(exc).__name__}: {exc}).") from None
    if img.ndim == 2:
        img = img[:, :, None]
    return img.astype(np.float32)


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
