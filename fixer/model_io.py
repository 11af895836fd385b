"""Loading and validating ONNX models safely (and reading an ``--inputs`` .npz).

Loading checks everything that would otherwise surface later as a traceback: the file exists and is
an ONNX protobuf, external data stays inside the model's folder and exists, the default-domain opset
is one nafix can reason about, the graph has no cycles, and every graph input has a static shape
(pinned by the caller where the model leaves a dimension symbolic). Shapes are then inferred
(:mod:`fixer.shapes`). Saving is :func:`fixer.outputs.save_model`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import onnx
from google.protobuf.message import DecodeError

from . import ir
from .errors import InputError, UsageError
from .importers.tflite import is_tflite
from .protomirror import model_class, onnx_schema
from .options import parse_input_shapes  # noqa: F401  (re-exported: light, see fixer.options)
from .shapes import fill_shapes_by_running, infer_shapes

log = logging.getLogger(__name__)

#: Oldest default-domain opset nafix accepts (shape inference and operator semantics before it differ).
MIN_OPSET = 7


@dataclass(frozen=True)
class DynamicDim:
    """A graph-input dimension that is not a fixed integer."""

    input: str
    axis: int
    symbol: str
    pinned_to: int | None

    def describe(self) -> str:
        sym = self.symbol or "?"
        if self.pinned_to is None:
            return f"input '{self.input}' axis {self.axis} is dynamic ('{sym}')"
        return f"input '{self.input}' axis {self.axis} ('{sym}') pinned to {self.pinned_to}"


@dataclass
class LoadedModel:
    """An ONNX model loaded, checked and shape-inferred, with what loading noticed."""

    path: Path
    model: onnx.ModelProto | None  # None once released (ModelAnalysis.released)
    opset: int
    dynamic_dims: tuple[DynamicDim, ...] = ()
    warnings: list[str] = field(default_factory=list)
    #: A model imported from another format (``fixer.importers``: e.g. the TFLite import and its
    #: interpreter check), or None for an ONNX file.
    imported: object | None = None

    @property
    def unresolved_dims(self) -> tuple[DynamicDim, ...]:
        return tuple(d for d in self.dynamic_dims if d.pinned_to is None)


def load_model(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    assume_batch_one: bool = True,
    max_opset: int | None = None,
) -> LoadedModel:
    """Load, validate and shape-infer the ONNX model at ``path``.

    ``input_shapes`` pins graph inputs (the ``--input-shape`` option). With ``assume_batch_one`` a
    symbolic leading (batch) dimension is taken as 1, as stedgeai does, and reported as pinned.
    Raises :class:`InputError` with a one-sentence message for every way the file can be unusable.
    """
    p = Path(path)
    data = read_model_bytes(p)
    if not data:
        raise InputError(f"{p}: the file is empty, not an ONNX model.")
    imported = None
    text_ok = False  # every text field is UTF-8 (else, or when unknown, _check_strings walks them)
    if is_tflite(data):  # by content: the TFLite flatbuffer identifier, whatever the file is called
        from .importers.tflite import import_tflite

        imported = import_tflite(data, p)
        model = imported.model
    else:
        text_ok = text_fields_are_utf8(data)  # (before the parse: its throwaway copy and the model never coexist)
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as exc:
            if p.suffix.lower() in (".tflite", ".lite"):  # named TFLite, but not one by content
                head = (f"bytes 4..8 are {data[4:8]!r}" if len(data) >= 8 else f"the file has only {len(data)} bytes")
                raise InputError(f"{p}: not a TFLite model ({head}, not the 'TFL3' identifier of a TFLite "
                                 "flatbuffer) and not an ONNX model either.") from None
            raise InputError(f"{p}: not an ONNX model, or truncated/corrupt (protobuf parse failed: {exc}).") from None
        if not model.HasField("graph") or (model.ir_version <= 0 and not model.opset_import):
            raise InputError(f"{p}: not an ONNX model (no graph or IR version in the protobuf).")
    scan = _NodeScan(model.graph, model.functions)
    if imported is None:
        _load_external_data(model, p, scan)
    opset = _check_opsets(model, p, max_opset)
    # The cycle and reference checks (_check_order) come next in line, but a graph the onnx checker
    # below passes clean is sorted, in SSA form and reads only what is defined: then they cannot
    # fail and are skipped. They still decide first wherever they did: before any later step's error
    # and before nodes are renamed (their messages name the file's nodes); after the checker otherwise.
    ordered = False
    try:
        _check_text_attributes(model.graph, p, scan)
        if not text_ok:  # the fast bytes-level check found a bad text field (or could not run): say which one
            _check_strings(model, p)
        dyn = _pin_input_shapes(model, p, input_shapes or {}, assume_batch_one, scan.init_names)
    except Exception as exc:
        failed = exc
    else:
        failed = None
    if failed is not None:
        _check_order(model.graph, p, scan)  # (outside the handler: its error is not chained to this one)
        raise failed
    warnings: list[str] = []
    named = [n.name for n in scan.nodes if n.name]
    renamed = 0
    if len(set(named)) != len(named):  # some nodes share a name
        _check_order(model.graph, p, scan)
        ordered = True
        renamed = make_node_names_unique(model, scan.nodes)
    if renamed:
        warnings.append(f"{renamed} node(s) shared their name with another node (onnxruntime refuses that); "
                        "renamed NAME_1, NAME_2, ...")
    # The checker reads serialized bytes: when loading changed nothing it checks (no external data
    # loaded, no node renamed, no --input-shape; a symbolic batch dimension pinned to 1 is no change
    # to the checker, which reads a dimension's value or name only to see that it has one of them)
    # the file's own bytes are the model, and serializing the parsed model again (its weights
    # included) would only copy them.
    unchanged = imported is None and not scan.external and not renamed and not input_shapes
    clean = False
    try:
        onnx.checker.check_model(data if unchanged else model)
        clean = True
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        warnings.append(f"onnx checker: {first}")
    except Exception as exc:  # noqa: BLE001 - the checker raises many kinds; none is fatal for analysis
        warnings.append(f"onnx checker could not run: {exc}")
    # (sparse initializers are defined names to the checker, not to _check_references)
    if not ordered and not (clean and not len(model.graph.sparse_initializer) and _checker_checks_order()):
        _check_order(model.graph, p, scan)
    # shape inference of a graph without subgraphs, functions or training graphs: shapes._infer_apart
    flat = not scan.subgraphs and not len(model.functions) and not len(model.training_info)
    # (inference changes no node: the outputs whose shapes the probe wants are known already)
    produced = scan.produced()
    init_names = scan.init_names  # (inference keeps every initializer, by name)
    del data, scan  # the parsed model holds everything now: the file is not kept through shape inference
    static: list[set[str]] = []  # (the names inference typed with a static shape, when it says them)
    model = infer_shapes(model, p, warnings, weights_apart=flat, static_out=static)
    if not any(d.pinned_to is None for d in dyn):
        fill_shapes_by_running(model, warnings, produced=produced, static=static[0] if static else None,
                               initializers=init_names)
    return LoadedModel(path=p, model=model, opset=opset, dynamic_dims=tuple(dyn), warnings=warnings,
                       imported=imported)


_STRING, _STRINGS = onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
_EXTERNAL = onnx.TensorProto.EXTERNAL


class _NodeScan:
    """One walk over the nodes of a graph and its subgraphs gathering what the load checks read, so
    each check does not walk (and wrap) the protobuf nodes again.

    ``nodes``: every node, depth first in :func:`_all_nodes`' order; ``inputs``/``outputs``: the
    top-level nodes' tensor names; ``bad_text``: the first (node, attribute) whose STRING(S) value is
    not UTF-8, in :func:`_check_text_attributes`' order; ``external``: some tensor (initializers of
    the graph and subgraphs, attribute tensors of graph, subgraphs and functions: the tensors
    ``onnx.external_data_helper`` loads) keeps its data in an external file; ``init_names``: the
    names of the graph's initializers.
    """

    __slots__ = ("nodes", "_top", "_inputs", "_outputs", "bad_text", "external", "subgraphs", "init_names")

    def __init__(self, graph: onnx.GraphProto, functions=()):
        top = list(graph.node)
        self._top = top
        self._inputs = None  # read when first asked for: only the cycle and reference checks do
        self._outputs = None  # (likewise)
        self.nodes: list = []
        self.bad_text = None
        self.subgraphs = False  # some node has a GRAPH or GRAPHS attribute (even an empty one)
        inits = list(graph.initializer)  # (each tensor's wrapper made once for both questions)
        self.external = any(t.data_location == _EXTERNAL for t in inits)
        self.init_names = {t.name for t in inits}
        self._walk(top)
        for fn in functions:  # functions are no graph nodes: only their attribute tensors count
            for node in fn.node:
                for attr in node.attribute:
                    self._tensors(attr)

    @property
    def inputs(self) -> list[list[str]]:
        if self._inputs is None:
            self._inputs = [n.input[:] for n in self._top]  # (a slice copies in C: twice as fast as list())
        return self._inputs

    @property
    def outputs(self) -> list[list[str]]:
        if self._outputs is None:
            self._outputs = [n.output[:] for n in self._top]
        return self._outputs

    def produced(self) -> list[str]:
        """The tensors the top-level nodes other than Constant make, in node order."""
        return [o for n in self._top if n.op_type != "Constant" for o in n.output[:] if o]

    def _tensors(self, attr) -> None:
        # whatever the attribute's declared type: onnx's loader visits ``t`` and ``tensors`` of all
        if not self.external and ((attr.HasField("t") and attr.t.data_location == _EXTERNAL)
                                  or any(t.data_location == _EXTERNAL for t in attr.tensors)):
            self.external = True

    def _walk(self, nodes) -> None:
        append = self.nodes.append
        for node in nodes:
            append(node)
            subgraphs = None
            for attr in node.attribute:
                kind = attr.type
                if kind == _STRING or kind == _STRINGS:
                    if self.bad_text is None:
                        for v in ((attr.s,) if kind == _STRING else attr.strings):
                            try:
                                v.decode("utf-8")
                            except UnicodeDecodeError:
                                self.bad_text = (node, attr)
                                break
                elif kind == _GRAPH or kind == _GRAPHS:
                    self.subgraphs = True
                    subgraphs = subgraphs or []
                    subgraphs.extend((attr.g,) if kind == _GRAPH else attr.graphs)
                if not self.external and (attr.HasField("t") or attr.tensors):
                    self._tensors(attr)
            for g in subgraphs or ():  # after the node's own attributes, as _all_nodes yields them
                if not self.external and any(t.data_location == _EXTERNAL for t in g.initializer):
                    self.external = True
                self._walk(g.node)


_UTF8_MIRROR: list = []


def _utf8_mirror():
    """A message class parsing ``onnx.ModelProto`` bytes with UTF-8 validation of every string field,
    or None where this protobuf runtime does not validate.

    ONNX's schema is proto2, whose parser hands invalid UTF-8 back as ``bytes``; the same schema
    declared proto3 (a private copy in its own descriptor pool) makes the protobuf runtime validate
    every string field while it parses, at C speed. A self-test on a crafted message decides whether
    it does here; if not, :func:`_check_strings` does all the work.
    """
    if _UTF8_MIRROR:
        return _UTF8_MIRROR[0]
    cls = None
    try:
        from google.protobuf.message import DecodeError
        fdp, old = onnx_schema()
        fdp.package = "nafix_utf8." + fdp.package
        fdp.name = "nafix_utf8/" + fdp.name
        fdp.syntax = "proto3"

        def to_proto3(messages):
            for m in messages:
                for f in m.field:
                    f.ClearField("default_value")
                    if f.label == f.LABEL_REQUIRED:
                        f.label = f.LABEL_OPTIONAL
                    if f.type_name.startswith(old):
                        f.type_name = ".nafix_utf8" + f.type_name
                to_proto3(m.nested_type)

        to_proto3(fdp.message_type)
        mirror = model_class(fdp)
        probe = onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"], name="NAFIXPROBE")], "g", [], []))
        good = probe.SerializeToString()
        mirror.FromString(good)
        try:
            mirror.FromString(good.replace(b"NAFIXPROBE", b"\xff\xfeFIXPROBE"))
        except DecodeError:
            cls = mirror  # rejects bad UTF-8 and accepts good text: usable
    except Exception:  # noqa: BLE001 - any trouble building it: the generic walk alone
        log.debug("no UTF-8 validating ONNX mirror; text fields are checked field by field", exc_info=True)
        cls = None
    _UTF8_MIRROR.append(cls)
    return cls


def text_fields_are_utf8(data: bytes) -> bool:
    """True when every string field of the serialized ONNX model ``data`` (names, op types, doc
    strings, metadata, ... of every message, nested graphs and functions included) is UTF-8 text;
    False when one is not, or when this cannot be decided here (then :func:`_check_strings` walks the
    parsed model and names the field)."""
    mirror = _utf8_mirror()
    if mirror is None:
        return False
    try:
        mirror.FromString(data)
    except Exception:  # noqa: BLE001 - bad UTF-8 (DecodeError) or anything else: the parse of the model decides
        return False
    return True


def _all_nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_nodes(g)


def make_node_names_unique(model: onnx.ModelProto, nodes: list | None = None) -> int:
    """Rename nodes whose (non-empty) name another node already has, subgraphs included; return how
    many were renamed. Names do not change what a model computes, but onnxruntime rejects duplicates.
    ``nodes``: the model's nodes in :func:`_all_nodes`' order when the caller has them already."""
    nodes = list(_all_nodes(model.graph)) if nodes is None else nodes
    named = [n.name for n in nodes if n.name]
    if len(set(named)) == len(named):
        return 0  # no two nodes share a non-empty name: nothing to rename
    from .graph import ProtoNode, unique_node_names

    return unique_node_names([ProtoNode(n) for n in nodes], sep="_", first=1, name_unnamed=False, avoid_all=True)


def invalid_model_error(path: str | os.PathLike[str], exc: BaseException) -> InputError | None:
    """For an unexpected failure ``exc`` while processing the model at ``path``: an InputError naming
    what is wrong with the file when the onnx checker rejects it (a corrupt model, not a nafix bug),
    else None (the failure is nafix's own)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError:
        head = b""
    if is_tflite(head):
        # a TFLite file: nafix's importer validated it (a corrupt one is an error there), so what
        # failed afterwards is nafix's own failure, not "an invalid ONNX model"
        return None
    try:
        onnx.checker.check_model(str(p))
    except Exception as chk:  # noqa: BLE001 - any checker complaint means the file is at fault
        first = next((ln.strip() for ln in str(chk).splitlines() if ln.strip()), type(chk).__name__)[:200]
        what = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")[:120]
        return InputError(f"{p}: not a valid ONNX model (onnx checker: {first}); nafix stopped on it "
                          f"({type(exc).__name__}{': ' + what if what else ''}).")
    return None


def open_input(p: Path, what: str, *, missing: str = "no such file", unreadable: str = "cannot be read"):
    """``p`` opened for binary reading when it is a regular file (:func:`fixer.fsutil.open_regular`:
    opened without blocking, then checked on the open descriptor, so a FIFO or a device never blocks
    and nothing can be swapped in between a check and the open), else one InputError sentence naming
    ``what`` (the file asked for, e.g. "ONNX model file"): missing, a folder, a FIFO/socket/device,
    unreadable."""
    from .fsutil import NotRegularFileError, open_regular

    try:
        return open_regular(p)
    except FileNotFoundError:
        raise InputError(f"{p}: {missing}.") from None
    except NotRegularFileError as exc:
        if exc.kind == "a folder":
            raise InputError(f"{p}: is a folder; give the {what} itself.") from None
        raise InputError(f"{p}: is not a regular file (a FIFO, socket or device); give the {what} itself.") from None
    except OSError as exc:
        raise InputError(f"{p}: {unreadable} ({exc.strerror or exc}).") from None


def read_model_bytes(p: Path) -> bytes:
    """The bytes of the model file ``p`` (opened with :func:`open_input`); every failure is one
    InputError sentence."""
    with open_input(p, "ONNX or TFLite model file") as fh:
        try:
            return fh.read()
        except OSError as exc:
            raise InputError(f"{p}: cannot be read ({exc.strerror or exc}).") from None
        except MemoryError:
            size = os.fstat(fh.fileno()).st_size
            raise InputError(f"{p}: the file ({size} bytes) does not fit in memory.") from None


def _load_external_data(model: onnx.ModelProto, path: Path, scan: _NodeScan | None = None) -> None:
    if scan is not None and not scan.external:
        return  # no tensor keeps its data outside the file: nothing to check or load
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    base = path.parent.resolve()
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        if not loc:
            raise InputError(f"{path}: tensor '{tensor.name}' uses external data without a location.")
        if Path(loc).is_absolute() or os.path.isabs(loc) or "\\" in loc and ":" in loc:
            raise InputError(
                f"{path}: tensor '{tensor.name}' points its external data at the absolute path '{loc}'; "
                "nafix only reads external data inside the model's folder."
            )
        target = (base / loc).resolve()
        if base not in target.parents and target != base:
            raise InputError(
                f"{path}: tensor '{tensor.name}' points its external data at '{loc}', outside the model's "
                "folder; refusing to read it (path traversal)."
            )
        if not target.exists():
            raise InputError(f"{path}: external data file '{loc}' for tensor '{tensor.name}' is missing.")
        from .fsutil import NotRegularFileError, open_regular

        try:  # onnx opens it next: a FIFO or device there would block the load for ever
            open_regular(target).close()
        except NotRegularFileError as exc:
            raise InputError(f"{path}: external data file '{loc}' for tensor '{tensor.name}' {exc.strerror}; "
                             "nafix reads external data only from regular files.") from None
        except OSError as exc:
            raise InputError(f"{path}: external data file '{loc}' for tensor '{tensor.name}' cannot be read "
                             f"({exc.strerror or exc}).") from None
        try:
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") not in (None, "") else None
        except ValueError:
            raise InputError(f"{path}: tensor '{tensor.name}' has a non-numeric external data offset or length "
                             f"({info.get('offset')!r}, {info.get('length')!r}).") from None
        if offset < 0 or (length is not None and length < 0):
            raise InputError(f"{path}: tensor '{tensor.name}' has a negative external data offset or length.")
        st = target.stat()
        size = st.st_size
        if offset > size or (length is not None and offset + length > size):
            raise InputError(
                f"{path}: external data file '{loc}' is too short for tensor '{tensor.name}' "
                f"(needs {offset + (length or 0)} bytes, has {size})."
            )
        if st.st_nlink > 1:
            raise InputError(
                f"{path}: external data file '{loc}' has {st.st_nlink} hard links; onnx refuses to read such a file "
                "(a hard link could expose any file on the system): give the model its own copy "
                f"(e.g. cp '{loc}' copy && mv copy '{loc}')."
            )
    try:
        onnx.load_external_data_for_model(model, str(base))
    except Exception as exc:  # noqa: BLE001 - onnx raises OSError, ValueError and checker errors here
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:300]
        raise InputError(f"{path}: external data could not be loaded ({first}).") from None


def _check_opsets(model: onnx.ModelProto, path: Path, max_opset: int | None) -> int:
    opset = ir.model_opset(model, missing=None)
    if opset is None:
        raise InputError(f"{path}: the model imports no default-domain ('ai.onnx') opset.")
    newest = onnx.defs.onnx_opset_version()
    hi = min(newest, max_opset) if max_opset else newest
    if opset < MIN_OPSET or opset > hi:
        raise InputError(
            f"{path}: default-domain opset {opset} is outside what nafix supports ({MIN_OPSET} to {hi})."
        )
    return opset


def _check_order(graph: onnx.GraphProto, path: Path, scan: _NodeScan) -> None:
    """The graph has no cycle and every node reads a tensor something provides."""
    _check_acyclic(graph, path, scan)
    _check_references(graph, path, scan)


_ORDER_CHECKED: list = []


def _checker_checks_order() -> bool:
    """True when onnx's checker, here, refuses the top-level graphs :func:`_check_order` refuses:
    unsorted nodes, a cycle (a self loop included), a read of a name nothing defines (in the default
    domain or another), a name produced twice or produced over a graph input; a self-test on crafted
    models, run once. False (the checks always run) if any of them passes or anything goes wrong."""
    if _ORDER_CHECKED:
        return _ORDER_CHECKED[0]
    ok = False
    try:
        from onnx import helper

        n = helper.make_node

        def model(*nodes) -> bytes:
            vi = [helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [2]) for v in ("x", "y")]
            m = helper.make_model(helper.make_graph(list(nodes), "g", vi[:1], vi[1:]),
                                  opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("nafix.test", 1)])
            m.ir_version = 7
            return m.SerializeToString()

        onnx.checker.check_model(model(n("Relu", ["x"], ["a"]), n("Add", ["a", "x"], ["y"])))
        refused = 0
        bad = (model(n("Relu", ["a"], ["y"]), n("Relu", ["x"], ["a"])),  # unsorted
               model(n("Relu", ["x"], ["a"]), n("Add", ["a", "c"], ["b"]), n("Relu", ["b"], ["c"]),
                     n("Identity", ["c"], ["y"])),  # a cycle
               model(n("Add", ["x", "y"], ["y"])),  # a self loop
               model(n("Add", ["x", "ghost"], ["y"])),  # an undefined name
               model(n("Op", ["x", "ghost"], ["y"], domain="nafix.test")),  # the same, in another domain
               model(n("Relu", ["x"], ["a"]), n("Relu", ["a"], ["y"]), n("Neg", ["x"], ["a"])),  # two producers
               model(n("Relu", ["x"], ["x"]), n("Relu", ["x"], ["y"])))  # a graph input produced again
        for data in bad:
            try:
                onnx.checker.check_model(data)
            except onnx.checker.ValidationError:
                refused += 1
        ok = refused == len(bad)
    except Exception:  # noqa: BLE001 - any doubt: the checks run
        log.debug("onnx checker self-test failed; the cycle and reference checks always run", exc_info=True)
        ok = False
    _ORDER_CHECKED.append(ok)
    return ok


def _check_acyclic(graph: onnx.GraphProto, path: Path, scan: _NodeScan | None = None) -> None:
    scan = scan or _NodeScan(graph)
    producers: dict[str, int] = {}
    for i, outs in enumerate(scan.outputs):
        for out in outs:
            if out:
                producers[out] = i
    n_nodes = len(scan.outputs)
    # the common case: every node reads only what earlier nodes produce (sorted, hence acyclic)
    for i, ins in enumerate(scan.inputs):
        if any(producers.get(t, -1) >= i for t in ins):
            break
    else:
        return
    indeg = [0] * n_nodes
    users: list[list[int]] = [[] for _ in range(n_nodes)]
    for i, ins in enumerate(scan.inputs):
        deps = {producers[t] for t in ins if t in producers}
        indeg[i] = len(deps)
        for d in deps:
            users[d].append(i)
    queue = deque(i for i, d in enumerate(indeg) if d == 0)
    seen = 0
    while queue:
        i = queue.popleft()
        seen += 1
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                queue.append(u)
    if seen != n_nodes:
        stuck = [graph.node[i] for i, d in enumerate(indeg) if d > 0]
        names = ", ".join(f"'{n.name or n.op_type}'" for n in stuck[:3])
        raise InputError(f"{path}: the graph has a cycle through {len(stuck)} node(s), e.g. {names}.")


def _check_text_attributes(graph: onnx.GraphProto, path: Path, scan: _NodeScan | None = None) -> None:
    """String attributes (modes, names) are text: bytes that are not UTF-8 mean a corrupt file."""
    scan = scan or _NodeScan(graph)
    if scan.bad_text is not None:
        node, attr = scan.bad_text
        raise InputError(f"{path}: node '{node.name or node.op_type}' attribute '{attr.name}' holds "
                         "bytes that are not UTF-8 text; the file is corrupt.")


def _check_strings(msg, path: Path, where: str = "model") -> None:
    """Every text field (names, op types, doc strings, metadata) of ``msg`` and its sub-messages must
    be UTF-8: protobuf hands back raw bytes for a corrupt one, which later breaks graph export."""
    from google.protobuf.descriptor import FieldDescriptor

    if isinstance(msg, onnx.TensorProto):  # never materialize the weights: only its text fields
        for name in ("name", "doc_string"):
            if isinstance(getattr(msg, name), bytes):
                raise InputError(f"{path}: {where}.{name} is not UTF-8 text; the file is corrupt.")
        for k, e in enumerate(msg.external_data):
            _check_strings(e, path, f"{where}.external_data[{k}]")
        return
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == FieldDescriptor.LABEL_REPEATED
        items = value if repeated else [value]
        if fd.type == FieldDescriptor.TYPE_STRING:
            if any(isinstance(v, bytes) for v in items):
                raise InputError(f"{path}: {where}.{fd.name} is not UTF-8 text; the file is corrupt.")
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            for k, item in enumerate(items):
                _check_strings(item, path, f"{where}.{fd.name}" + (f"[{k}]" if repeated else ""))


def _check_references(graph: onnx.GraphProto, path: Path, scan: _NodeScan | None = None) -> None:
    scan = scan or _NodeScan(graph)
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    known.update(o for outs in scan.outputs for o in outs)
    for k, ins in enumerate(scan.inputs):
        for t in ins:
            if t and t not in known:
                node = graph.node[k]
                raise InputError(
                    f"{path}: node '{node.name or node.op_type}' reads tensor '{t}', which no node, "
                    "initializer or graph input provides."
                )


def _pin_input_shapes(
    model: onnx.ModelProto,
    path: Path,
    shapes: Mapping[str, tuple[int, ...]],
    assume_batch_one: bool,
    inits: set[str] | None = None,
) -> list[DynamicDim]:
    """Pin ``model``'s graph inputs (not its initializers: ``inits``, their names, when the caller has
    them) as :func:`load_model` says; the dimensions that were not fixed integers."""
    if inits is None:
        inits = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    for name in shapes:
        if name not in inputs:
            avail = ", ".join(f"'{n}'" for n in inputs) or "none"
            raise UsageError(f"--input-shape names '{name}', which is not a graph input (inputs: {avail}).")
    found: list[DynamicDim] = []
    for name, vi in inputs.items():
        ttype = vi.type.tensor_type
        if not ttype.HasField("shape"):
            if name in shapes:
                for v in shapes[name]:
                    ttype.shape.dim.add().dim_value = v
            else:
                found.append(DynamicDim(name, -1, "unknown rank", None))
            continue
        dims = ttype.shape.dim
        if name in shapes:
            want = shapes[name]
            if len(want) != len(dims):
                raise UsageError(
                    f"--input-shape {name}=... has {len(want)} dimensions but input '{name}' has {len(dims)}."
                )
            for axis, (d, v) in enumerate(zip(dims, want)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != v:
                    raise UsageError(
                        f"--input-shape {name}: axis {axis} is fixed to {d.dim_value} in the model, not {v}."
                    )
                if not (d.HasField("dim_value") and d.dim_value > 0):
                    found.append(DynamicDim(name, axis, d.dim_param, v))
                d.dim_value = v
            continue
        for axis, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if axis == 0 and len(dims) >= 2 and assume_batch_one:
                found.append(DynamicDim(name, axis, d.dim_param, 1))
                d.dim_value = 1
            else:
                found.append(DynamicDim(name, axis, d.dim_param, None))
    return found


#: The first bytes of an .npz (a zip archive) and of a single .npy array.
_ZIP_MAGIC = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"


def read_npz(p: Path, option: str) -> dict[str, np.ndarray]:
    """The arrays of the .npz at ``p`` (for ``option``), never unpickling; one InputError sentence for
    a missing or unreadable file, something else than an .npz, or arrays of Python objects."""
    import zipfile

    import numpy as np

    fh = open_input(p, f"{option} .npz file", missing=f"{option} file not found",  # np.load reads this very file
                    unreadable=f"the {option} file cannot be read")
    with fh:
        return _read_npz_from(fh, p, option)


def _read_npz_from(fh, p: Path, option: str) -> dict[str, np.ndarray]:
    import zipfile

    import numpy as np

    try:
        head = fh.read(8)
        fh.seek(0)
    except OSError as exc:
        raise InputError(f"{p}: the {option} file cannot be read ({exc.strerror or exc}).") from None
    expected = "an .npz archive (numpy.savez) with one numeric array per graph input, keyed by input name"
    if head.startswith(_NPY_MAGIC):
        raise InputError(f"{p}: is a single .npy array, not an .npz archive; {option} needs {expected}.")
    if not head.startswith(_ZIP_MAGIC):
        raise InputError(f"{p}: is not an .npz archive (it does not start like a zip file); {option} needs {expected}.")
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(fh, allow_pickle=False) as z:
            for key in z.files:
                try:
                    out[key] = z[key]
                except ValueError as exc:
                    if "pickle" in str(exc).lower() or "object" in str(exc).lower():
                        raise InputError(f"{p}: array '{key}' holds Python objects (dtype=object), which nafix never "
                                         f"loads; {option} needs {expected}.") from None
                    raise
    except InputError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)[:200]
        raise InputError(f"{p}: not a readable .npz archive ({first}); {option} needs {expected}.") from None
    for key, arr in out.items():
        if arr.dtype.kind not in "biuf":
            raise InputError(f"{p}: array '{key}' has dtype {arr.dtype}, not numbers; {option} needs {expected}.")
    return out
