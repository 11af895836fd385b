"""Registered match predicates: the named conditions a rule's ``match.when`` list may use.

Each predicate is ``(node, ctx, **params) -> Verdict``; its docstring is user-facing (shown by
``nafix rules``) and the verdict's detail names the node in quotes. ``ctx`` is the engine's
:class:`~fixer.rewriters.Match`-like context with ``view``, ``placement`` and ``profile``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from . import ir

from .graph import QDQ_OPS, node_label
from .npu.constraints import Verdict


@dataclass(frozen=True)
class Predicate:
    name: str
    func: Callable[..., Verdict]
    doc: str
    params: tuple[str, ...]
    required: tuple[str, ...]


PREDICATES: dict[str, Predicate] = {}


def predicate(name: str):
    def deco(fn):
        if not fn.__doc__:
            raise TypeError(f"predicate {name} needs a docstring: it is shown to users")
        sig = inspect.signature(fn)
        params = tuple(p for p in list(sig.parameters)[2:])
        required = tuple(p for p, v in list(sig.parameters.items())[2:] if v.default is inspect.Parameter.empty)
        PREDICATES[name] = Predicate(name, fn, " ".join(inspect.cleandoc(fn.__doc__).split()), params, required)
        return fn

    return deco


def _q(node: ir.Node) -> str:
    return f"'{node_label(node)}'"


@predicate("fails_constraint")
def fails_constraint(node, ctx, constraint: str) -> Verdict:
    """The placement model puts the node in SW (or flags a hazard on it) because of the named
    constraint or reason id."""
    p = ctx.placement.by_name.get(node.name)
    if p is None:
        return Verdict(False, f"{_q(node)} was not placed")
    for r in p.reasons + p.notes:
        if r.constraint == constraint:
            return Verdict(True, r.detail)
    return Verdict(False, f"{_q(node)} does not fail '{constraint}'")


@predicate("weights_constant")
def weights_constant(node, ctx) -> Verdict:
    """The node's weights (second input) are a constant, directly or through QuantizeLinear/DequantizeLinear."""
    if len(node.inputs) > 1 and ctx.view.is_const_like(node.inputs[1]):
        return Verdict(True, f"{_q(node)} has constant weights")
    other = node.inputs[1].name if len(node.inputs) > 1 else "nothing"
    return Verdict(False, f"{_q(node)} multiplies two activations (second input '{other}' is not a constant)")


def _quantized(node, ctx) -> tuple[bool, str]:
    view = ctx.view
    acts = [t for t in node.inputs if t.name and not view.is_const_like(t)]
    ins = all(view.producer(t) is not None and view.producer(t).op == "DequantizeLinear" for t in acts) and bool(acts)
    outs = all(any(c.op == "QuantizeLinear" for c in t.outputs) for t in node.outputs if t.name)
    if ins and outs:
        return True, f"{_q(node)} sits between DequantizeLinear and QuantizeLinear"
    return False, f"{_q(node)} is not wrapped in DequantizeLinear/QuantizeLinear (a float op)"


@predicate("is_quantized")
def is_quantized(node, ctx) -> Verdict:
    """The node is quantized QDQ-style: its activation inputs come from DequantizeLinear and its outputs
    go to QuantizeLinear."""
    ok, why = _quantized(node, ctx)
    return Verdict(ok, why)


@predicate("is_float")
def is_float(node, ctx) -> Verdict:
    """The node computes in float: it is not wrapped in DequantizeLinear/QuantizeLinear (rewriting a
    quantized node this way needs new quantization parameters: nafix --quantize)."""
    ok, why = _quantized(node, ctx)
    if ok:
        return Verdict(False, f"{_q(node)} is quantized; rewriting it needs new quantization parameters for the partial results (nafix --quantize)")
    return Verdict(True, why)


@predicate("attr_equals")
def attr_equals(node, ctx, name: str, value: Any) -> Verdict:
    """The node's attribute ``name`` equals ``value``."""
    v = node.attrs.get(name)
    v = v.decode() if isinstance(v, bytes) else v
    return Verdict(v == value, f"{_q(node)} has {name}={v!r}")


@predicate("attr_in")
def attr_in(node, ctx, name: str, values: list) -> Verdict:
    """The node's attribute ``name`` is one of ``values``."""
    v = node.attrs.get(name)
    v = v.decode() if isinstance(v, bytes) else v
    return Verdict(v in list(values), f"{_q(node)} has {name}={v!r}")


@predicate("placement_role")
def placement_role(node, ctx, role: str) -> Verdict:
    """The placement model gives the node this role (e.g. 'graph-output conversion')."""
    p = ctx.placement.by_name.get(node.name)
    have = p.role if p is not None else None
    return Verdict(have == role, f"{_q(node)} has role {have!r}")


@predicate("single_consumer")
def single_consumer(node, ctx) -> Verdict:
    """The node's first output has exactly one consumer and is not a graph output."""
    out = node.outputs[0]
    n = len(out.outputs) + (1 if ctx.view.is_graph_output(out) else 0)
    return Verdict(n == 1, f"{_q(node)} output '{out.name}' has {n} reader(s)")


@predicate("producer_op")
def producer_op(node, ctx, ops: list) -> Verdict:
    """The producer of the node's first input is one of ``ops``."""
    p = ctx.view.producer(node.inputs[0]) if node.inputs else None
    op = p.op if p is not None else "graph input"
    return Verdict(op in list(ops), f"{_q(node)} reads the output of {op}")


@predicate("consumer_op")
def consumer_op(node, ctx, ops: list) -> Verdict:
    """The only consumer of the node's first output is one of ``ops``."""
    cons = node.outputs[0].outputs if node.outputs else []
    if len(cons) != 1:
        return Verdict(False, f"{_q(node)} output has {len(cons)} consumers")
    return Verdict(cons[0].op in list(ops), f"{_q(node)} feeds a {cons[0].op}")


@predicate("reshaped_into_quantize")
def reshaped_into_quantize(node, ctx) -> Verdict:
    """The node's output reaches QuantizeLinear nodes only, through one or more reshape-only ops
    (Reshape, Flatten, Squeeze, Unsqueeze) each read by that one path, and is no graph output."""
    from .rewriters.constants import _reshape_then_quantize

    found = _reshape_then_quantize(ctx.view, node.outputs[0]) if node.outputs else None
    if found is None:
        return Verdict(False, f"{_q(node)} output does not reach a QuantizeLinear through reshape-only ops alone")
    chain, _ = found
    return Verdict(True, f"{_q(node)} output is quantized only after its {' -> '.join(n.op for n in chain)}")


__all__ = ["PREDICATES", "Predicate", "predicate", "QDQ_OPS"]
