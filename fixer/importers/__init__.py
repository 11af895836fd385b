"""Importers: other model formats brought into the QDQ ONNX graph the rest of nafix works on.

Each importer recognises its format by content (never by file extension alone) and returns an
``onnx.ModelProto`` that records where it came from in its metadata (``nafix.source_format``).
"""

from __future__ import annotations

from . import tflite_ops  # noqa: F401 - registers its operators with the importer (tflite.register_operators)
from .tflite import TFLITE_IDENTIFIER, is_tflite

__all__ = ["TFLITE_IDENTIFIER", "is_tflite", "source_format", "check_loaded"]


def source_format(model) -> str:
    """The format a loaded model was imported from (``onnx`` when it was read as ONNX)."""
    for prop in getattr(model, "metadata_props", ()):
        if prop.key == "nafix.source_format":
            return prop.value
    return "onnx"


def check_loaded(loaded, *, seed: int = 0, samples: int = 1):
    """Check an imported model against its own runtime once (cached on the import).

    Returns the check (None for an ONNX file). A failed check raises :class:`InputError` (an error row
    in audit, exit 2 for fix): a model that does not import exactly is never analysed as if it did.
    Without a runtime the check is skipped and a warning says so.
    """
    from ..errors import InputError

    imp = getattr(loaded, "imported", None)
    if imp is None:
        return None
    if imp.check is None:
        from .tflite_check import check_import

        imp.check = check_import(imp, imp.data, seed=seed, samples=samples)
    check = imp.check
    if not check.ok and check.interpreter_failed:
        raise InputError(f"{loaded.path}: cannot check the TFLite import: {check.reason}.")
    if not check.ok:
        raise InputError(f"{loaded.path}: the TFLite import does not reproduce the TFLite interpreter: "
                         f"{check.reason}.")
    text = check.summary()
    if not check.checked and text not in loaded.warnings:
        loaded.warnings.append(text)
    return check
