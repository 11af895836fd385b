"""Named model builders for rule case files: ``family.function`` -> ``function(**params) -> ModelProto``.

Each family module (channels, resize, qdq, ops, ...) holds the builders its rules' case files name.
"""

from __future__ import annotations

import importlib

import onnx


def build(spec: str, params: dict | None = None) -> onnx.ModelProto:
    module, _, func = spec.rpartition(".")
    if not module:
        raise ValueError(f"builder '{spec}' must be written family.function")
    fn = getattr(importlib.import_module(f"tests.builders.{module}"), func)
    return fn(**(params or {}))
