"""The committed sample models give the SW nodes their real counterparts gave (NEURAL_ART.md s4),
each for the documented reason."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from fixer.api import AnalysisOptions, analyze_path
from fixer.npu.constraints import REGISTRY
from fixer.npu.mpool import default_stm32n6_pools

SAMPLES = Path(__file__).resolve().parents[1] / "sample_models"


@lru_cache(maxsize=None)
def analysis(name: str, options: frozenset[str] = frozenset()):
    return analyze_path(SAMPLES / f"{name}.onnx", AnalysisOptions(stedgeai_options=options))


#: stedgeai options that keep float graph edges as SW conversions (the ONNX default makes them int8:
#: NEURAL_ART.md s7, MobileFaceNet with and without --input-data-type float32)
FLOAT_IO = frozenset({"--input-data-type float32", "--output-data-type float32"})


def sw(a) -> dict[str, list[str]]:
    """SW node name -> its failing constraint ids."""
    return {n.name: [r.constraint for r in n.reasons] for n in a.placement.sw_nodes()}


def live_requirement(cid: str) -> str:
    from fixer.npu.profile import load_profile

    return REGISTRY[cid].requirement(load_profile().values())


def test_denoiser_257_output_channel_layers_run_in_sw():
    a = analysis("denoiser_257", FLOAT_IO)
    nodes = a.placement.by_name
    for name in ("conv_in", "conv_skip", "gemm_mask"):
        p = nodes[name]
        assert p.unit == "SW", name
        (r,) = p.reasons
        assert r.constraint == "awkward_output_channels"
        assert r.requirement == live_requirement("awkward_output_channels")
        assert r.detail.startswith(f"'{name}' has 257 output channels, which has no divisor giving chunks <= 144")
        assert r.tag == "INF"
        assert p.kernel == "int8"  # int8 I/O: no float island around them
    # the 257-*input* layer ran on the NPU in the real log
    assert nodes["conv_down"].unit == "HW"
    assert sw(a) == {
        "spec_QuantizeLinear": ["graph_edge_quantize"],
        "conv_in": ["awkward_output_channels"],
        "conv_skip": ["awkward_output_channels"],
        "transpose_seq_DequantizeLinear": ["float_island"],  # feeds the float LSTM
        "lstm": ["sw_op:LSTM"],
        "reshape_flat_QuantizeLinear": ["float_island"],  # re-quantizes the LSTM output
        "gemm_mask": ["awkward_output_channels"],
        "mask_DequantizeLinear": ["graph_edge_dequantize"],
    }
    assert "'lstm' is a LSTM" == nodes["lstm"].reasons[0].detail
    assert a.estimate.sw_epochs == 8
    # with stedgeai's default options the float graph edges become int8: their conversions go
    assert set(sw(analysis("denoiser_257"))) == set(sw(a)) - {"spec_QuantizeLinear", "mask_DequantizeLinear"}


def test_movenet_like_bilinear_resizes_and_float_edges():
    a = analysis("movenet_like", FLOAT_IO)
    got = sw(a)
    resizes = sorted(n for n in got if a.placement.by_name[n].op_type == "Resize")
    assert resizes == ["resize_up1", "resize_up2", "resize_up3"]
    for name in resizes:
        (r,) = a.placement.by_name[name].reasons
        assert r.constraint == "resize_nearest_asymmetric"
        assert r.detail == f"'{name}' has mode 'linear'"
        assert "bilinear (linear) Resize runs in SW" in r.requirement
    assert got == {
        "image_QuantizeLinear": ["graph_edge_quantize"],
        "resize_up1": ["resize_nearest_asymmetric"],
        "resize_up2": ["resize_nearest_asymmetric"],
        "resize_up3": ["resize_nearest_asymmetric"],
        "heatmaps_DequantizeLinear": ["graph_edge_dequantize"],
    }
    q = a.placement.by_name["image_QuantizeLinear"].reasons[0]
    assert q.detail == "'image_QuantizeLinear' quantizes the float graph input 'image'"
    dq = a.placement.by_name["heatmaps_DequantizeLinear"].reasons[0]
    assert dq.detail == "'heatmaps_DequantizeLinear' dequantizes into the graph output"
    # the Resizes have int8 SW kernels: no conversion epochs around them (as in the real MoveNet)
    assert a.estimate.sw_epochs == 5
    assert Counter(g.ops[0] for g in a.estimate.groups if g.unit == "SW") == Counter(
        {"Resize": 3, "QuantizeLinear": 1, "DequantizeLinear": 1})
    assert a.estimate.sw_ops == Counter({"Resize": 3, "QuantizeLinear": 1, "DequantizeLinear": 1})
    # default options: the input QuantizeLinear and the Q -> DQ -> output are dropped (int8 I/O)
    d = analysis("movenet_like")
    assert set(sw(d)) == set(got) - {"image_QuantizeLinear", "heatmaps_DequantizeLinear"}
    assert d.placement.by_name["image_QuantizeLinear"].unit == "folded"


def test_classifier_softmax():
    a = analysis("classifier_softmax", FLOAT_IO)
    assert sw(a) == {
        "image_QuantizeLinear": ["graph_edge_quantize"],
        "softmax": ["sw_op:Softmax"],
        "probs_DequantizeLinear": ["graph_edge_dequantize"],
    }
    (r,) = a.placement.by_name["softmax"].reasons
    assert r.detail == "'softmax' is a Softmax"
    assert "Softmax runs in SW unless stedgeai is given --expand-softmax" in r.requirement
    # with --expand-softmax the Softmax moves to the NPU; the float edges stay
    b = analysis("classifier_softmax", FLOAT_IO | {"--expand-softmax"})
    assert set(sw(b)) == {"image_QuantizeLinear", "probs_DequantizeLinear"}
    assert b.placement.by_name["softmax"].unit == "HW"
    assert b.estimate.sw_epochs == a.estimate.sw_epochs - 1


def test_big_activations_do_not_fit_on_chip():
    a = analysis("big_activations")
    m = a.memory
    cap = sum(p.size_bytes for p in default_stm32n6_pools() if p.enabled and p.writable and p.on_chip)
    assert m.onchip_bytes == cap
    assert m.fits_on_chip is False
    # the 480 x 640 x 32 int8 activation alone is 9.8 MB
    assert m.largest_tensor_bytes == 480 * 640 * 32
    assert m.peak_activation_bytes >= 480 * 640 * 32 > cap
    (f,) = [f for f in a.findings if f.constraint == "activations_on_chip"]
    assert f.severity == "note" and f.tag == "OBS"
    assert "on-chip RAM" in f.requirement
    assert f"{m.peak_activation_bytes / 1024:.0f} KiB" in f.detail and f"{cap / 1024:.0f} KiB on-chip" in f.detail
    for conv in ("conv1", "conv2", "conv3", "conv4"):
        assert a.placement.by_name[conv].unit == "HW", conv


def test_uint8_default_quant_is_a_compile_error():
    a = analysis("uint8_default_quant")
    (f,) = [f for f in a.findings if f.constraint == "int8_activations"]
    assert f.severity == "compile_error"
    assert "uint8" in f.requirement and "quantized unsigned integer format is not supported" in f.requirement
    assert "uint8-quantized tensor(s)" in f.detail and f.detail.startswith("'conv1'")
    convs = [a.placement.by_name[n] for n in ("conv1", "conv2")]
    # the compile fails as a whole; the nodes are placed as they would be once re-quantized to int8
    assert all("int8_activations" in [r.constraint for r in p.notes] and p.unit == "HW" for p in convs)


def test_st_way_samples_have_no_uint8_finding():
    for name in ("denoiser_257", "movenet_like", "classifier_softmax", "big_activations"):
        assert not [f for f in analysis(name).findings if f.constraint == "int8_activations"], name


@pytest.mark.parametrize("name", ["denoiser_257", "movenet_like", "classifier_softmax", "big_activations",
                                  "uint8_default_quant"])
def test_float_sources_run_entirely_in_sw(name):
    a = analysis(f"{name}_float")
    assert a.estimate.sw_epochs == a.estimate.epochs > 0
    assert "model_not_quantized" in [f.constraint for f in a.findings]
    for p in a.placement.sw_nodes():
        assert p.reasons, p.name
        if p.op_type in {"Conv", "Gemm", "Relu"}:
            assert "quantized_activations" in [r.constraint for r in p.reasons], p.name
