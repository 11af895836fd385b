"""The verify contract of each change an engine run made, and the boundary checks its changes ask for."""

from __future__ import annotations

from .metrics import BoundaryCheck, loosest


def change_contracts(engine, rules_by_id) -> dict:
    """The verify contract of each change: its rule's, with a rewriter's per-change override."""
    from dataclasses import replace

    from ..rewriters import REWRITERS

    out = {}
    for i, c in enumerate(engine.changes):
        base = rules_by_id[c.rule].verify
        out[i] = replace(base, contract=c.contract) if c.contract else base
    # a whole-model rewrite that is not exact (NAF014 re-quantizing weights) changes what every later
    # rewrite is compared against: their checks at the rewritten nodes allow its difference too
    lossy = [out[i] for i, c in enumerate(engine.changes)
             if c.contract and REWRITERS[rules_by_id[c.rule].rewriter].whole_model]
    if lossy:
        out = {i: loosest([v, *lossy]) for i, v in out.items()}
    return out


def boundary_checks(engine, contracts) -> list:
    return [BoundaryCheck(t, c.rule, contracts[i], c.region_inputs)
            for i, c in enumerate(engine.changes) for t in c.boundary]
