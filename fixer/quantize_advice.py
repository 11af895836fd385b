"""The words nafix uses for what ``--quantize`` is estimated to remove (the estimate itself is
:mod:`fixer.quantize.gain`). Text only, and outside the quantize package, which imports the analysis
stack: the audit renderings of a cached result use it."""

from __future__ import annotations

from typing import Any


def gain_text(gain: dict[str, Any], model: str = "MODEL") -> str:
    """One sentence for an audit: ``--quantize`` is the fix of this model and what it would remove."""
    what = "a float model" if gain["kind"] == "float" else f"{gain['nodes']} float island node(s)"
    first = (f"; plain nafix {model} rewrites some of them without calibration first (rules "
             f"{', '.join(gain['plain_rules'])})" if gain.get("plain_rules") else "")
    return (f"{what}: --quantize is the fix (nafix {model} --quantize, calibration data with --calib): "
            + _removes(gain) + first)


def gain_advice(before, gain: dict[str, Any] | None, *, float_model: bool) -> list[str]:
    """``nafix MODEL``'s advice about ``--quantize`` (at most one sentence): a float model is said to
    be one, with what quantizing it is estimated to remove (``gain``, of the model the fix leaves), or
    that nafix estimates it would not pay off; float islands with their estimated gain."""
    if float_model:
        head = (f"this is a float model: every op of a float model runs in SW on the NPU (estimated "
                f"{before.sw_epochs} SW epochs of {before.epochs}); ")
        if gain is None:
            return [head + "--quantize quantizes it to int8 for the NPU, but nafix estimates the quantized model no "
                    "better than this one (SW epochs, epochs and time), so it is not advised"]
        return [head + "run nafix with --quantize to quantize it to int8 for the NPU, which is the fix: "
                + _removes(gain)]
    if gain is None:
        return []
    return [f"{gain['nodes']} node(s) run in float for want of quantization (float islands); run nafix with "
            f"--quantize (calibration data with --calib) to quantize them, which is the fix: " + _removes(gain)]


def _removes(gain: dict[str, Any]) -> str:
    sw, ms = gain["sw_epochs"], gain["ms"]
    time = (f", estimated time {ms['before']:.3f} -> {ms['after']:.3f} ms" if ms.get("removed") is not None else "")
    return (f"it would remove an estimated {sw['removed']} of {sw['before']} SW epochs{time} (estimated from the "
            f"QDQ structure quantization gives the model, without calibrating)")
