"""onnxruntime runs of the gate: sessions of a whole model or, for a large graph, of its consecutive
segments (:mod:`fixer.segments`), begun early and made ready when needed; models given extra outputs."""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import onnx

from ..runtime import serialized_sessions, session_as_written


def session(model: onnx.ModelProto):
    """An onnxruntime session of ``model`` as written (no graph optimization); a large graph is made
    and run as consecutive segments, the same values (:mod:`fixer.segments`)."""
    return begin_session(model).ready()


class _Whole:
    """A whole-graph session not made yet: :meth:`ready` makes it (see :func:`begin_session`)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model

    def ready(self):
        return session_as_written(self.model)


class _Pooled:
    """A whole-graph session being made by the shared segment threads."""

    def __init__(self, future):
        self.future = future

    def ready(self):
        return self.future.result()


def begin_session(model: onnx.ModelProto, *, keep: bool = True, extra: Sequence[str] = (),
                  names: Callable[[], tuple[list[list[str]], list[list[str]]]] | None = None):
    """:func:`session` of ``model`` with ``extra`` as outputs too (:func:`_with_outputs`), begun:
    ``.ready()`` returns the session or raises onnxruntime's error. A large graph's segments are
    written now and handed to the segment threads, which make their sessions while the caller goes
    on (:class:`fixer.segments.SegmentedSession`; the model is not copied to add ``extra``); any
    other graph's session is handed to the threads the caller shares
    (:func:`fixer.segments.shared_workers`, the gate's), or else made by ``.ready()``. With ``keep``
    False, a large graph's segment sessions are dropped once made (:class:`fixer.segments.Loaded`:
    they answer what they loaded as; running the graph makes them again), for a model that is mostly
    only checked to load. ``names()``: each node's input and output names (``node.input[:]``,
    ``node.output[:]``), where the caller has them (:func:`fixer.segments.plan`)."""
    from .. import segments

    cut = segments.plan(model, extra=extra, names=names)
    if cut is not None:
        try:
            return segments.SegmentedSession(model, cut, session_as_written, keep=keep, extra=extra,
                                             make_serialized=serialized_sessions(model.ir_version))
        except segments.Unsegmentable:
            pass
    model = _with_outputs(model, extra)
    pool = segments.current_workers()
    if pool is not None:
        return _Pooled(pool.submit(session_as_written, model))
    return _Whole(model)


def _begin_fixed(fixed: onnx.ModelProto, extra: Sequence[str], keep: bool = True, names=None):
    """The fixed model's session with ``extra`` as outputs, begun (:func:`begin_session`, ``keep``
    and ``names`` as there; in the gate, handed to its shared threads after the original's); a graph whose
    segments are made in order and one of them rejected gives what raises that error when waited for."""
    try:
        return begin_session(fixed, keep=keep, extra=extra, names=names)
    except Exception as exc:  # noqa: BLE001 - a segment made in order was rejected: the gate's verdict
        return _Failed(exc)


def _fixed_session(begun) -> tuple[object | None, str]:
    """The session ``begun`` (:func:`_begin_fixed`), or (None, the first line of onnxruntime's
    error): a rewrite that onnxruntime rejects fails the gate, not nafix."""
    try:
        return begun.ready(), ""
    except Exception as exc:  # noqa: BLE001
        return None, str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


class _Failed:
    """A session that could not be begun: :meth:`ready` raises its error."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def ready(self):
        raise self.exc


def _sharing_segment_workers(func):
    """``func`` run with :func:`fixer.segments.shared_workers`: the segment sessions it begins (large
    graphs) are made by threads it shares between its models and ends before it returns."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from ..segments import shared_workers

        with shared_workers():
            return func(*args, **kwargs)

    return wrapper


def _renamed(model: onnx.ModelProto, suffix: str) -> onnx.ModelProto:
    """``model`` with every tensor and node name suffixed (no subgraphs: the part has none)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    ren = (lambda x: x + suffix if x else x)
    for n in m.graph.node:
        ins, outs = [ren(i) for i in n.input], [ren(o) for o in n.output]
        del n.input[:]
        n.input.extend(ins)
        del n.output[:]
        n.output.extend(outs)
        n.name = ren(n.name)
    for t in m.graph.initializer:
        t.name = ren(t.name)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        vi.name = ren(vi.name)
    return m


def _merged(a: onnx.ModelProto, b: onnx.ModelProto) -> onnx.ModelProto:
    """One model of two with disjoint names (``a``'s header)."""
    m = onnx.ModelProto()
    m.CopyFrom(a)
    for f in ("node", "initializer", "input", "output", "value_info"):
        getattr(m.graph, f).extend(getattr(b.graph, f))
    return m


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    return {o for n in model.graph.node for o in n.output if o}


def _with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """``model`` with ``names`` among its graph outputs too (each once; a copy, where there are any)."""
    if not names:
        return model
    from ..segments import with_extra

    m = onnx.ModelProto()
    m.CopyFrom(model)
    declared = [o.name for o in m.graph.output]
    for n in with_extra(declared, names)[len(declared):]:  # (what a segmented session fetches too)
        m.graph.output.append(onnx.helper.ValueInfoProto(name=n))
    return m
