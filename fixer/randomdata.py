"""Seeded random input values, shared by the calibration's random samples, the equivalence gate's
inputs and the TFLite import check (:func:`uniform`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: float64 values drawn per call: 64 KiB, under glibc's smallest mmap threshold (128 KiB), so the
#: scratch comes from the heap and is reused instead of being mapped (and faulted in) afresh
_CHUNK = 8192


def uniform(rng: np.random.Generator, lo: float, hi: float, shape: Sequence[int], dtype) -> np.ndarray:
    """``rng.uniform(lo, hi, size=shape).astype(dtype)``, bit for bit, without the float64 array of the
    whole shape: the values are drawn in chunks into the result. Each element takes the next double of
    the generator's stream whatever the chunk sizes, so the draws, the stream left behind and the
    float64 -> ``dtype`` rounding are those of the one-shot call. For a 640x640 RGB sample the
    one-shot call maps and faults in a fresh 9.8 MB scratch each time: drawing a YOLOv8n's 16
    calibration samples beside onnxruntime's runs took 0.21 s that way, 0.06-0.13 s in chunks."""
    out = np.empty(tuple(shape), dtype=dtype)
    flat = out.reshape(-1)
    n = flat.size
    for a in range(0, n, _CHUNK):
        flat[a:a + _CHUNK] = rng.uniform(lo, hi, size=min(_CHUNK, n - a))
    return out
