"""Where each node of a model runs, by node, from a report row (the JSON dict of
:func:`fixer.report_data.analysis_dict`): its placement (``HW``, ``SW`` or ``hybrid``), the reason
in words, its estimated epochs and its share of their estimated time. One account read by the
three pictures nafix gives of a graph: the node annotations of a written model (Netron shows
``metadata_props``), the Model Explorer overlay and the hover titles of the HTML epoch strips.
No rendering and no printing here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from .report import ms_text

HW, SW, HYBRID = "HW", "SW", "hybrid"
#: Worst first: a node that makes a SW epoch and a HW one is shown as SW.
_RANK = {SW: 0, HYBRID: 1, HW: 2}
#: The text of a node that makes no epoch of its own.
FOLDED_REASON = "estimated to make no epoch of its own (folded, or merged into a neighbouring epoch)"
PLACEMENT_KEY = "nafix.placement"
REASON_KEY = "nafix.reason"


@dataclass(frozen=True)
class NodeInfo:
    """One node's estimated placement."""

    placement: str  # HW | SW | hybrid
    reason: str
    epochs: tuple[int, ...] = ()  # the estimated epochs it is part of (1-based)
    ms: float | None = None  # its share of those epochs' estimated time (None: not estimated)
    folded: bool = False  # in no epoch at all


def node_infos(row: dict[str, Any]) -> dict[str, NodeInfo]:
    """Placement and reason of every node named by the row's epochs or SW nodes, by node name. A
    node in several epochs takes the worst unit (SW, then hybrid, then HW); an epoch's estimated
    time is shared evenly among its nodes, so the nodes' ms add up to the epochs' total."""
    units: dict[str, list[str]] = {}
    epochs: dict[str, list[int]] = {}
    ms: dict[str, float] = {}
    timed = True
    for ep in row.get("epochs") or []:
        names = list(dict.fromkeys(ep.get("nodes") or []))
        for name in names:
            units.setdefault(name, []).append(ep["unit"] if ep["unit"] in _RANK else SW)  # (a unit nafix does not know: SW)
            epochs.setdefault(name, []).append(ep["index"])
        if ep.get("ms") is None:
            timed = False
        elif names:
            for name in names:
                ms[name] = ms.get(name, 0.0) + ep["ms"] / len(names)
    reasons: dict[str, list[str]] = {}
    for n in row.get("sw_nodes") or []:
        # an op stedgeai inserts into a HW node is listed as 'node/op', from that node
        owner = n["name"] if n["name"] in units or not n.get("from_nodes") else n["from_nodes"][0]
        reasons.setdefault(owner, []).extend(n.get("reasons") or [])
    out: dict[str, NodeInfo] = {}
    for name in set(units) | set(reasons):
        unit = min(units.get(name) or [SW], key=_RANK.__getitem__)
        idx = tuple(epochs.get(name, ()))
        where = (f"estimated epoch{'s' if len(idx) > 1 else ''} {', '.join(map(str, idx))}" if idx
                 else "no epoch of its own")
        cost = f", {ms_text(ms[name])} ms" if timed and name in ms else ""
        why = "; ".join(dict.fromkeys(reasons.get(name) or []))
        if not why:
            why = "estimated to run on the NPU" if unit == HW else f"estimated to run in a {unit} epoch"
        out[name] = NodeInfo(unit, f"{why} ({where}{cost})", idx, ms.get(name) if timed else None)
    return out


def info_or_folded(infos: dict[str, NodeInfo], name: str) -> NodeInfo:
    """The node's info, or the one of a node that makes no epoch (placed HW, folded)."""
    return infos.get(name) or NodeInfo(HW, FOLDED_REASON, folded=True)


# ---------------------------------------------------------------------------------------------------
# the node annotations of a written model (what Netron shows in a node's properties)


def _subgraphs(node) -> Iterable:
    import onnx

    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _set_meta(node, info: NodeInfo) -> None:
    """Set the nafix.* keys of ``node`` (in place, where they are; added at the end otherwise); every
    other entry is kept as it is, in its order."""
    values = {PLACEMENT_KEY: info.placement, REASON_KEY: info.reason}
    for p in node.metadata_props:
        if p.key in values:
            p.value = values.pop(p.key)
    for k, v in values.items():
        node.metadata_props.add(key=k, value=v)


def annotate_model(model, row: dict[str, Any], view_names: dict[str, str] | None = None) -> int:
    """Put ``nafix.placement`` and ``nafix.reason`` into the ``metadata_props`` of every node of
    ``model`` (in place), from the report row of its analysis; a node inside an If/Loop/Scan body
    gets the one of the node that runs it. ``view_names`` maps a node's first output tensor to the
    name the analysis knew it by (an unnamed node is named by the analysis); by default a node is
    found by its own name. Returns how many nodes were annotated. Only metadata changes: what the
    model computes does not."""
    infos = node_infos(row)
    count = 0

    def walk(graph, parent: NodeInfo | None) -> None:
        nonlocal count
        for node in graph.node:
            if parent is not None:
                info = parent
            else:
                key = node.name
                if view_names is not None and node.output and node.output[0]:
                    key = view_names.get(node.output[0], key)
                info = info_or_folded(infos, key)
            _set_meta(node, info)
            count += 1
            for g in _subgraphs(node):
                walk(g, info)

    walk(model.graph, None)
    return count


def view_node_names(view) -> dict[str, str]:
    """First output tensor name -> node name, for the top-level nodes of a :class:`fixer.graph.GraphView`
    (whose unnamed nodes have names the analysis gave them)."""
    out: dict[str, str] = {}
    for n in view.nodes:
        if n.outputs and n.outputs[0].name:
            out[n.outputs[0].name] = n.name
    return out


def view_node_outputs(view) -> dict[str, list[str]]:
    """Node name -> its output tensor names (top-level nodes of a :class:`fixer.graph.GraphView`)."""
    return {n.name: [t.name for t in n.outputs if t.name] for n in view.nodes}
