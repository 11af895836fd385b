"""The engine frees the graph views it is done with (fixer.engine.run_engine)."""

from __future__ import annotations

import gc

from fixer import ir
from fixer.engine import run_engine
from fixer.graph import GraphView
from fixer.npu.estimate import estimate_epochs
from fixer.npu.placement import place
from fixer.npu.profile import load_profile
from fixer.rules import load_rules
from tests.builders.qdq import qdq_sub_chain


def test_engine_frees_each_round_view_it_replaces(tmp_path):
    """The view a committed round edited is released (its node/tensor cycles broken) when the next
    round's view replaces it: the cyclic collector finds only the final graph's objects, and the
    fix's results are those of a run without the release."""
    model = qdq_sub_chain(12)
    profile = load_profile()
    view = GraphView(model)
    placement = place(view, profile)
    start = (view, placement, estimate_epochs(view, placement, profile))
    nodes_before = len(view.graph.nodes)
    was = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        res = run_engine(model, load_rules(), profile=profile, start=start)
        assert res.changes and res.rounds >= 2
        assert view.graph is None  # the start view, edited by round 1 and replaced: released
        final_nodes = len(res.view.graph.nodes) if res.view is not None else None
        del res, start, placement
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        stray = sum(1 for o in gc.garbage if type(o) is ir.Node)
        gc.set_debug(0)
        gc.garbage.clear()
    finally:
        if was:
            gc.enable()
    assert stray <= (final_nodes or 0) < nodes_before + 200
