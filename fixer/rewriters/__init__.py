"""Registered rewriters: how a matched node is rebuilt into an NPU-friendly equivalent.

A rewriter is a function ``(match, editor) -> RewriteResult`` registered with :func:`rewriter`. It
receives the anchor node the rule matched and the rule's parameters, builds replacement nodes with
the :class:`~fixer.graph.Editor` (which names them ``<anchor>__nafix_<k>`` and records provenance)
and rewires consumers. It never searches the graph beyond the match's immediate neighbourhood and
never cleans up: the engine does one cleanup + toposort per round. When it cannot apply (a
precondition the YAML match cannot express), it raises :class:`NearMiss` with a sentence saying
why; the engine reports that as a near-miss. The docstring is user-facing (``nafix rules NAF001``).

Rewriter modules register on import; :func:`load_all` imports every family.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .. import ir

from ..graph import Editor, GraphView
from ..npu.placement import Placement
from ..npu.profile import TargetProfile

FAMILIES = ("channels", "resize", "qdq", "ops", "requant", "recurrent", "uint8", "dilation", "constants")


class NearMiss(Exception):
    """The rule matched but cannot apply here; the message says why (a whole sentence)."""


def quoted(node) -> str:
    """A node as near-miss sentences name it: ``'name'`` (or its op and index when it has no name)."""
    from ..graph import node_label

    return f"'{node_label(node)}'"


def per_tensor_qparams(view: GraphView, node, q, per_axis: str):
    """(scale, zero-point) arrays of the QuantizeLinear/DequantizeLinear ``q`` near ``node``, or a
    :class:`NearMiss` naming ``node``: when they cannot be read, or when they are per axis
    (``per_axis``: the rest of that sentence, after the node's name)."""
    from ..graph import qdq_params

    try:
        scale, zp, _ = qdq_params(view, q)
    except ValueError as exc:
        raise NearMiss(f"{quoted(node)}: {exc}.") from None
    if scale.size != 1:
        raise NearMiss(f"{quoted(node)}{per_axis}")
    return scale, zp


@dataclass(frozen=True)
class IoChange:
    """A change to the model's interface, recorded so firmware can convert data at the edges."""

    kind: str  # "input" | "output"
    name: str
    dtype: str  # new element type, e.g. "int8", "uint8"
    scale: float | list[float]
    zero_point: int | list[int]
    was: str = "float32"


@dataclass(frozen=True)
class Match:
    """What a rule matched: the anchor node, plus the context a rewriter may read."""

    rule_id: str
    node: ir.Node
    view: GraphView
    placement: Placement
    profile: TargetProfile
    params: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # fix options (e.g. input_type)


@dataclass
class RewriteResult:
    detail: str  # one sentence: "split 257 output channels into 144 + 113"
    io_changes: list[IoChange] = field(default_factory=list)
    contract: str | None = None  # overrides the rule's verify contract for this change (rare)
    # False when the rewrite changes the representation of the tensor after the node (re-quantization):
    # comparing integer codes there is meaningless, only the graph outputs are compared
    boundary: bool = True


Rewriter = Callable[[Match, Editor], RewriteResult]


@dataclass(frozen=True)
class RegisteredRewriter:
    name: str
    func: Rewriter
    doc: str
    params: Mapping[str, Any]  # parameter name -> default
    # rewrites the whole model at once (uint8 -> int8): the engine runs it first in a round, alone
    whole_model: bool = False


REWRITERS: dict[str, RegisteredRewriter] = {}


def rewriter(name: str, *, whole_model: bool = False, **defaults: Any):
    """Register a rewriter under ``name``; keyword arguments declare its parameters and defaults
    (a rule may set only these). A ``whole_model`` rewriter rebuilds the whole graph (the engine
    runs it alone, at the start of a round)."""

    def deco(fn: Rewriter) -> Rewriter:
        if not fn.__doc__:
            raise TypeError(f"rewriter {name} needs a docstring: it is shown to users")
        if name in REWRITERS and REWRITERS[name].func is not fn:
            raise TypeError(f"rewriter {name} is registered twice")
        REWRITERS[name] = RegisteredRewriter(name, fn, " ".join(inspect.cleandoc(fn.__doc__).split()), dict(defaults),
                                             whole_model)
        return fn

    return deco


def load_all() -> dict[str, RegisteredRewriter]:
    """Import every rewriter family so the registry is complete."""
    for fam in FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{fam}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{fam}":
                raise
    return REWRITERS
