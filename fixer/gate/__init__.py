"""The equivalence gate: run the original and the rewritten model in onnxruntime on the same inputs
and judge every output under the verify contract of the rules that were applied (:func:`verify`).

Rooms: :mod:`.contracts` (what a rule is held to), :mod:`.inputs` (the data both models run on),
:mod:`.runs` (onnxruntime sessions and runs), :mod:`.parts` (the parts of a model run apart),
:mod:`.noise` (the noise floor), :mod:`.metrics` (the comparisons), :mod:`.changes` (the contract of
each engine change), :mod:`.check` (the gate itself).
"""

from __future__ import annotations

from .changes import boundary_checks, change_contracts
from .check import Verification, verify
from .contracts import CONTRACT_ORDER, CONTRACTS, VerifyContract
from .inputs import check_inputs_npz, load_inputs_npz, make_inputs
from .metrics import PROPAGATED_MIN_COSINE, BoundaryCheck, OutputCheck, compare, dequantize, loosest, quantize_like_ort
from .runs import begin_session, session

__all__ = [
    "CONTRACTS", "CONTRACT_ORDER", "PROPAGATED_MIN_COSINE", "BoundaryCheck", "OutputCheck", "Verification",
    "VerifyContract", "begin_session", "boundary_checks", "change_contracts", "check_inputs_npz", "compare",
    "dequantize", "load_inputs_npz", "loosest", "make_inputs", "quantize_like_ort", "session", "verify",
]
