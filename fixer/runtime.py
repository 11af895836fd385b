"""The one place nafix makes onnxruntime sessions.

Every session nafix makes is a CPU session of a model as written: no graph optimization (they could
fuse Q/DQ differently in two models being compared), warnings and below not logged. What differs
between callers is a parameter of :func:`session_options` (threads, memory arena, spinning), so the
same options give the same bits as before. Also here: the IR version onnxruntime accepts
(:func:`prepare_for_runtime`), the session of a graph with many initializers (:func:`runtime_session`),
and the equivalence gate's sessions, whole (:func:`session_as_written`) or of the serialized
segments of a large graph (:func:`serialized_sessions`, for :class:`fixer.segments.SegmentedSession`).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import onnx

log = logging.getLogger(__name__)

#: Newest IR version the supported onnxruntime releases load; recent onnx writes newer ones.
MAX_RUNTIME_IR_VERSION = 10


def session_options(*, threads: int | None = None, arena: bool = True, spinning: bool = True):
    """onnxruntime session options: no graph optimization, log level 3 (errors), and as asked:
    ``threads`` intra-op threads (onnxruntime's default where None), the CPU memory arena
    (``arena`` False: each run's buffers go back to the system instead of growing a pool), idle
    worker threads spinning between parallel sections or (``spinning`` False) sleeping: scheduling
    only, the same kernels compute the same bits."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads is not None:
        opts.intra_op_num_threads = threads
    if not arena:
        opts.enable_cpu_mem_arena = False
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


#: From this many initializers (Constant nodes of the main graph count: onnxruntime turns them into
#: initializers), :func:`runtime_session` creates a session through the path that keeps them in its
#: graph. Below it, saving the copy costs more than the search it avoids (measured on onnxruntime
#: 1.32: 5,000 initializers +5%, 10,000 -27%, 49,247 -44% of the session's creation).
MANY_INITIALIZERS = 10_000


def runtime_initializers(model: onnx.ModelProto) -> int:
    """The initializers onnxruntime holds for ``model``'s main graph: its initializers and Constant nodes."""
    g = model.graph
    return len(g.initializer) + sum(1 for n in g.node if n.op_type == "Constant" and not n.domain)


def runtime_session(data: bytes, opts, *, initializers: int):
    """An onnxruntime CPU session of the serialized model ``data`` with session options ``opts``.

    onnxruntime moves each initializer out of the graph as it hands it to the session, finding it by
    name in the graph's initializer list each time: quadratic in their number (onnxruntime 1.32, a
    QDQ chain of 49,247 initializers: 1.8 s of the session's 3.7 s, 63x the 4,925-initializer
    chain's). A session that saves its optimized model keeps the initializers in its graph and skips
    that step. From ``MANY_INITIALIZERS`` ``initializers`` on, the session is created so, the copy
    written in a temporary directory deleted right after; the graph that runs is the same (the same
    ``opts``: optimization level and transformers), so are its outputs. The graph's copy of the
    initializers stays while the session lives. Should that path fail (no room for the copy, a
    graph onnxruntime cannot save), the session is created as usual, and its error, if any, is the
    one the caller sees."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if initializers >= MANY_INITIALIZERS and not opts.optimized_model_filepath:
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix="nafix-ort-") as tmp:
                opts.optimized_model_filepath = os.path.join(tmp, "session.onnx")
                try:
                    return ort.InferenceSession(data, opts, providers=providers)
                finally:
                    opts.optimized_model_filepath = ""
        except Exception:  # noqa: BLE001 - this path is only faster: the usual session decides
            log.debug("onnxruntime session keeping its initializers failed; creating it as usual")
    return ort.InferenceSession(data, opts, providers=providers)


def prepare_for_runtime(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return ``model`` with an IR version onnxruntime accepts (recent onnx writes newer ones)."""
    if model.ir_version > MAX_RUNTIME_IR_VERSION:
        model = model_copy(model)
        model.ir_version = MAX_RUNTIME_IR_VERSION
    return model


def model_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of ``model``."""
    clone = onnx.ModelProto()
    clone.CopyFrom(model)
    return clone


def gate_options():
    """The equivalence gate's session options. Graph optimizations could fuse Q/DQ differently in the
    two models; compare the models as written. Idle worker threads sleep instead of spinning: the
    gate's runs are short and many, often beside other work: on a loaded 2-core machine spinning
    cost ~40-70% more CPU time for the same runs."""
    return session_options(spinning=False)


def session_as_written(model: onnx.ModelProto):
    """The gate's onnxruntime session of ``model`` (:func:`gate_options`), its IR version capped."""
    return runtime_session(prepare_for_runtime(model).SerializeToString(), gate_options(),
                           initializers=runtime_initializers(model))


def serialized_sessions(ir_version: int) -> Callable[[bytes, int], object]:
    """What makes :func:`session_as_written` of a model given serialized (of IR version
    ``ir_version``), with at most ``n`` initializers and Constant nodes
    (:class:`fixer.segments.SegmentedSession`)."""
    # a ModelProto field written again later in the bytes overrides the earlier one: the IR version
    # onnxruntime accepts, as prepare_for_runtime sets it
    cap = onnx.ModelProto(ir_version=MAX_RUNTIME_IR_VERSION).SerializeToString() \
        if ir_version > MAX_RUNTIME_IR_VERSION else b""

    def make(data: bytes, n: int):
        if n >= MANY_INITIALIZERS:  # (rare in a segment: count them, as session_as_written does)
            n = runtime_initializers(onnx.ModelProto.FromString(data))
        return runtime_session(data + cap, gate_options(), initializers=n)

    return make
