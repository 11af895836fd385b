"""A node-data overlay for Google's AI Edge Model Explorer (``nafix audit MODEL -f model-explorer``).

The format is Model Explorer's ``GraphNodeData`` (``model_explorer/node_data_builder.py`` of the
``ai-edge-model-explorer`` package, read in release 0.1.34): ``{"name": ..., "results": {KEY:
{"value": NUMBER, "bgColor": CSS colour, "textColor": CSS colour}}, "gradient": [{"stop": 0..1,
"bgColor": ...}]}``, where KEY is an output tensor name of a node (matched against the
``tensor_name`` of the node's outputs metadata) or a node id, and a result's ``bgColor`` takes
precedence over the gradient. Load it in Model Explorer's side panel ("Node data") beside the
model.

nafix writes one result per node output: the value is the node's share of its epochs' estimated
time in ms (:mod:`fixer.node_info`), the colour its estimated placement (HW green, hybrid amber,
SW red, grey for a node that makes no epoch of its own). A model without a time estimate gets
its placement as the value (0 HW, 1 hybrid, 2 SW). No printing, no files written here."""

from __future__ import annotations

from typing import Any

from .errors import UsageError
from .node_info import HW, HYBRID, SW, info_or_folded, node_infos
from .report_html import COLOURS

FOLDED_COLOUR = "#dddddd"
TEXT = {HW: "#ffffff", HYBRID: "#222222", SW: "#ffffff"}
PLACEMENT_VALUE = {HW: 0, HYBRID: 1, SW: 2}
#: Every field name of Model Explorer's GraphNodeData / NodeDataResult / GradientItem (0.1.34) that
#: nafix writes; the tests check them against that package's dataclasses when it is installed.
GRAPH_FIELDS = ("name", "results", "gradient")
RESULT_FIELDS = ("value", "bgColor", "textColor")


def overlay(row: dict[str, Any], outputs: dict[str, list[str]]) -> dict[str, Any]:
    """The GraphNodeData dict of one audit row; ``outputs`` maps each node name (as the analysis
    named it) to its output tensor names, the keys of ``results``."""
    infos = node_infos(row)
    timed = bool(row.get("epochs")) and all(ep.get("ms") is not None for ep in row["epochs"])
    results: dict[str, dict[str, Any]] = {}
    for name, tensors in outputs.items():
        info = info_or_folded(infos, name)
        if info.folded:
            res = {"value": 0, "bgColor": FOLDED_COLOUR, "textColor": "#444444"}
        else:
            value = round(info.ms, 6) if timed and info.ms is not None else PLACEMENT_VALUE[info.placement]
            res = {"value": value, "bgColor": COLOURS[info.placement], "textColor": TEXT[info.placement]}
        for t in tensors:
            results.setdefault(t, res)
    from .outputs import text_mark

    what = ("estimated ms per node" if timed else "estimated placement (0 HW, 1 hybrid, 2 SW)")
    return {  # the name first: its mark (near the top of the file) lets a rerun replace the file
        "name": f"nafix: {what}; colour HW green, hybrid amber, SW red, grey no epoch. {text_mark()}",
        "results": results,
        # used only where a result has no colour of its own (every nafix result has one): low to high
        "gradient": [{"stop": 0, "bgColor": COLOURS[HW]}, {"stop": 0.5, "bgColor": COLOURS[HYBRID]},
                     {"stop": 1, "bgColor": COLOURS[SW]}],
    }


def node_outputs_of(path: str) -> dict[str, list[str]]:
    """Node name -> output tensor names of the model at ``path`` (ONNX or TFLite, read as the audit
    reads it, so an unnamed node gets the name its report row uses)."""
    from .graph import GraphView
    from .model_io import load_model
    from .node_info import view_node_outputs

    loaded = load_model(path)
    view = GraphView(loaded.model)
    try:
        return view_node_outputs(view)
    finally:
        view.release()


def audit_overlay(report: dict[str, Any]) -> dict[str, Any]:
    """The overlay of the one model of an audit report (Model Explorer shows one graph at a time)."""
    rows = report["models"]
    if len(rows) != 1:
        raise UsageError(f"-f model-explorer writes the node data of one model; {len(rows)} models were audited: "
                         "give one model file.")
    (row,) = rows
    if row.get("error") or not row.get("epochs"):
        raise UsageError(f"{row['path']}: no estimate to show in Model Explorer ({row.get('error') or 'no epochs'}).")
    return overlay(row, node_outputs_of(row["path"]))
