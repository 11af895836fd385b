"""Where each reason's fact is written down: anchors of docs/NPU_FACTS.md by constraint id. Light
(no analysis import): the SARIF and GitHub renderings of a cached audit use it.

``$NAFIX_DOCS_URL`` (e.g. ``https://github.com/ORG/nafix/blob/main/docs``) makes the links point at
the team's copy of the docs (what GitHub code scanning shows as "learn more"); without it they are
``file:`` URIs of the docs shipped with this nafix (docs/ in a checkout, fixer/_docs in a wheel)."""

from __future__ import annotations

import os
from pathlib import Path

FACTS_DOC = "NPU_FACTS.md"
RULES_DOC = "RULES.md"
DOCS_URL_ENV = "NAFIX_DOCS_URL"

#: constraint id (or reason id) -> anchor in docs/NPU_FACTS.md
CONSTRAINT_ANCHORS = {
    "static_shape": "geometry", "rank_limit": "geometry", "dim_limit": "geometry", "line_buffer": "geometry",
    "max_opset": "geometry",
    "quantized_activations": "float-islands", "params_quantized": "float-islands", "int8_activations": "uint8",
    "weights_constant": "gemm", "gemm_bias_constant": "gemm-bias",
    "awkward_output_channels": "prime-channels", "awkward_input_channels": "prime-channels",
    "conv_kernel_native": "conv", "conv_dilation": "conv",
    "prelu_slope_quantized": "activations", "fused_into_conv": "activations",
    "eltwise_broadcast": "eltwise", "sub_constant_first": "eltwise", "div_by_constant": "div",
    "transpose_perm": "movement", "concat_equal_inputs": "movement", "slice_rank3_channels": "movement",
    "pad_constant_mode": "pad", "pool_window": "pooling", "global_pool_size": "global-pool",
    "reduce_as_global_pool": "reduce", "batchnorm_folded": "batchnorm", "resize_nearest_asymmetric": "resize",
    "depthwise_stride2_hang": "hangs", "reshape_between_conv_relu_hang": "hangs",
    "graph_edge_quantize": "graph-edge-qdq", "graph_edge_dequantize": "graph-edge-qdq",
    "float_island": "qdq-around-sw", "operator_table": "operators",
    "activations_on_chip": "activation-overflow", "memory_pools": "memory-pools",
}
#: op type of an ``sw_op:OP`` reason -> anchor
OP_ANCHORS = {
    "Softmax": "softmax", "Resize": "resize", "DepthToSpace": "depth-to-space", "SpaceToDepth": "lowerings",
    "Cast": "cast", "QuantizeLinear": "qdq", "DequantizeLinear": "qdq", "BatchNormalization": "batchnorm",
    "Div": "div", "Pad": "pad", "ReduceSum": "reduce", "ReduceMin": "reduce", "ReduceProd": "reduce",
    "ConvTranspose": "lowerings",
    **{op: "unsupported-ops" for op in ("LSTM", "GRU", "RNN", "Einsum", "Where", "Expand", "ScatterND", "TopK", "If",
                                        "Loop", "NonZero", "GridSample", "Gather", "ArgMax", "InstanceNormalization",
                                        "Log", "Softplus", "Tile", "Greater", "Less", "Equal")},
}


def anchor(constraint: str) -> str:
    """The NPU_FACTS.md anchor of a constraint or reason id (``sw_op:OP`` and lowerings too)."""
    if constraint in CONSTRAINT_ANCHORS:
        return CONSTRAINT_ANCHORS[constraint]
    head, _, op = constraint.partition(":")
    if head == "sw_op":
        return OP_ANCHORS.get(op, "operators")
    if head.startswith("lower"):
        return "lowerings"
    return "operators"


def docs_base() -> str:
    """The URL of the docs folder: $NAFIX_DOCS_URL, else a file: URI of the docs shipped with nafix."""
    env = os.environ.get(DOCS_URL_ENV, "").strip()
    if env:
        return env.rstrip("/")
    here = Path(__file__).resolve().parent
    for folder in (here / "_docs", here.parent / "docs"):
        if (folder / FACTS_DOC).is_file():
            return folder.as_uri()
    return (here.parent / "docs").as_uri()


def fact_url(constraint: str) -> str:
    return f"{docs_base()}/{FACTS_DOC}#{anchor(constraint)}"


def rule_url(rule_id: str, name: str) -> str:
    """The rule's section in docs/RULES.md (its heading ``## NAF003 bilinear-resize``)."""
    return f"{docs_base()}/{RULES_DOC}#{rule_id.lower()}-{name.lower()}"
