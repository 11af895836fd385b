"""The verify contracts: what the equivalence gate holds a rewrite to. Each rule cites one (its
``verify:`` entry); a model is held to the loosest of the rules applied (:func:`fixer.gate.metrics.loosest`)."""

from __future__ import annotations

from dataclasses import dataclass

CONTRACTS = ("exact", "lsb", "tolerance", "ranking")
#: Looser contracts come later: the gate for a model uses the loosest contract among applied rules.
CONTRACT_ORDER = {c: i for i, c in enumerate(CONTRACTS)}


@dataclass(frozen=True)
class VerifyContract:
    contract: str = "exact"
    rtol: float = 1e-5
    atol: float = 0.0
    lsb: float = 1.0

    def describe(self) -> str:
        if self.contract == "exact":
            return "bit-exact"
        if self.contract == "lsb":
            return f"within {self.lsb:g} LSB of the output quantization"
        if self.contract == "tolerance":
            return f"max abs error <= {self.rtol:g} x output range + {self.atol:g}"
        return "argmax and ranking preserved"
