"""uint8 -> int8 (NAF014): stedgeai rejects uint8 activations; the exact conversion needs no calibration.

The conversion itself is :func:`fixer.quantize.uint8.convert_uint8_graph` (the one ``--quantize`` uses,
on the live graph here):
every uint8 QuantizeLinear/DequantizeLinear gets zero-point ``zp - 128`` with the same scale, the
tensors between them become int8 (the int8 value is the uint8 value minus 128, so every dequantized
value is unchanged), uint8 graph edges become int8 (the application feeds ``x - 128`` and reads
``y + 128``; recorded as interface changes), and uint8 or asymmetric weights are re-quantized to
int8 symmetric per channel as onnxruntime would. It walks the whole uint8 region at once (a uint8
QuantizeLinear and the DequantizeLinear nodes that read it must change together), so it is a
whole-model rewriter: the engine runs it alone at the start of a round.
"""

from __future__ import annotations

from ..errors import NafixError
from ..graph import Editor
from . import IoChange, Match, NearMiss, RewriteResult, rewriter


@rewriter("uint8_to_int8", whole_model=True, requantize_weights=True)
def uint8_to_int8(match: Match, ed: Editor) -> RewriteResult:
    """Converts every uint8 activation of the model to int8 exactly: each uint8 QuantizeLinear and
    DequantizeLinear gets zero-point - 128 with the same scale, the tensors between them (through data
    movement) become int8, and uint8 graph inputs and outputs become int8 (feed x - 128, read y + 128).
    With `requantize_weights` uint8 or asymmetric weights are re-quantized to int8 symmetric per
    channel (max |w| / 127), as nafix --quantize does; the change is then verified within the rule's
    tolerance instead of bit-exact."""
    from ..quantize.uint8 import _tensor_types, convert_uint8_graph

    try:
        conv = convert_uint8_graph(ed.graph, ed, _tensor_types(match.view.model), io="int8",
                                   requantize_weights=bool(match.params.get("requantize_weights", True)),
                                   model_name=f"'{match.node.name}'")
    except NafixError as exc:
        raise NearMiss(exc.message) from None  # raised before the graph is changed
    if not conv.changes:
        raise NearMiss(f"'{match.node.name}' reads a uint8 tensor nafix finds no uint8 QuantizeLinear or "
                       f"DequantizeLinear for.")
    io = [IoChange(c.kind, c.name, c.dtype, c.scale, c.zero_point, was=c.was) for c in conv.io_changes]
    detail = "; ".join(conv.changes)
    contract = None
    if not conv.exact:
        contract = "tolerance"
        detail += f" (weights re-quantized: max abs weight error {conv.max_weight_error:.3g}, not bit-exact)"
    return RewriteResult(detail=detail, io_changes=io, contract=contract, boundary=False)
