"""fixer.randomdata.uniform: the chunked draw equals numpy's one-shot ``uniform(...).astype(...)``."""

from __future__ import annotations

import numpy as np
import pytest

from fixer import randomdata
from fixer.randomdata import uniform


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 5), (randomdata._CHUNK,), (randomdata._CHUNK + 1,),
                                   (1, 3, 64, 65), (2, 0, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("lo_hi", [(-1.0, 1.0), (0.0, 255.0), (-3e38, 3e38)])
def test_uniform_is_the_one_shot_draw_bit_for_bit(shape, dtype, lo_hi):
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    with np.errstate(over="ignore"):  # (float16 of +-3e38: inf on both sides)
        want = a.uniform(*lo_hi, size=shape).astype(dtype)
        got = uniform(b, *lo_hi, shape, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    # the generator is left where the one-shot call leaves it: the next draws agree
    assert a.random(5).tobytes() == b.random(5).tobytes()


def test_uniform_in_small_chunks_still_agrees(monkeypatch):
    monkeypatch.setattr(randomdata, "_CHUNK", 7)
    a, b = np.random.default_rng(1), np.random.default_rng(1)
    assert uniform(b, -2.0, 5.0, (4, 9), np.float32).tobytes() == a.uniform(-2.0, 5.0, size=(4, 9)).astype(
        np.float32).tobytes()


def test_uniform_rejects_what_numpy_rejects():
    with pytest.raises(OverflowError):
        uniform(np.random.default_rng(0), -np.inf, 0.0, (3,), np.float32)
