"""Quantization for the Neural-ART NPU, always through ``onnxruntime.quantization``.

The NPU accepts one scheme (NPU_FACTS.md#quantization): int8 activations per tensor (asymmetric allowed),
int8 *symmetric per-channel* weights, QDQ format; uint8 activations are rejected by the compiler.
This module never implements a quantizer of its own: calibration and the choice of every new scale
and zero-point are onnxruntime's ``quantize_static``. What it adds is arithmetic on ranges that are
already calibrated (an exact uint8 -> int8 shift, a symmetric re-quantization of a known weight or
output range) and the plumbing around onnxruntime:

* calibration data (:class:`CalibrationOptions`, :func:`open_calibration`): a folder of ``.npz``
  files (one sample each, arrays keyed by input name), one ``.npz`` whose arrays carry a leading
  sample axis, a folder of images, or seeded random data (``calibration="random"``: say so loudly);
* :func:`quantize_float_model`: the ST recipe (QDQ, QInt8 activations asymmetric, QInt8 weights
  symmetric per channel) plus the NPU ops onnxruntime leaves in float by default
  (:func:`npu_op_types`), PRelu slopes quantized symmetric per channel, and a post-check
  (:func:`check_npu_quantization`) and the float islands that remain;
* :func:`convert_uint8_to_int8`: exact shift of uint8 activations to int8 (``q - 128``, zero-point
  ``- 128``, same scale: every dequantized value is unchanged) and symmetric per-channel
  re-quantization of uint8 (or asymmetric) weights, reporting the weight error;
* :func:`requantize_islands`: quantize only the float islands of a QDQ model (e.g. MobileFaceNet's
  float PRelu slopes) with onnxruntime, keeping every existing scale and zero-point;
* :func:`accuracy_report`: float vs quantized outputs (cosine, SNR, max abs error) and the tensors
  with the lowest SQNR, from ``onnxruntime.quantization.qdq_loss_debug``;
* :func:`symmetric_output_params`: zero-point 0 parameters covering an already calibrated range
  (for NAF013, the "scale-offset format" that blocked HW lowering).

Images (PPM/PGM/PNM, BMP, PNG, JPEG) are decoded with Pillow. Each image is converted to the model input: resized to ``image_size``
(default: the input's H, W) with ``bilinear`` (half-pixel centres) or ``nearest`` sampling, turned
to 1 or 3 channels (luminance or replication), put in ``channel_order``, normalised as
``(pixel * scale - mean) / std`` and laid out as NCHW or NHWC (``auto``: channels 1 or 3 on axis 1
-> NCHW, on the last axis -> NHWC). A uint8 model input receives the raw pixels, an int8 input
``pixel - 128``.

No printing: everything is logged through ``logging`` and returned in dataclasses; errors are
:class:`~fixer.errors.InputError` / :class:`~fixer.errors.UsageError` sentences naming the file.
"""

from __future__ import annotations

from .modelproto import (  # noqa: F401
    MAX_IR_VERSION,
    _ORT_METADATA_KEYS,
    _NP_OF_ELEM,
    _copy,
    _attr,
    _unique_names,
    _strip_initializer_inputs,
    _drop_unused_initializers,
    _clamp_ir,
    _drop_ort_metadata,
    _is_quantized,
    _load_profile,
    _quiet_onnxruntime,
    _ORIG_SUFFIX,
    _rename_collisions,
    _apply_tensor_renames,
    _rename_back,
)
from .calibration import (  # noqa: F401
    Progress,
    IMAGE_SUFFIXES,
    CalibrationOptions,
    InputSpec,
    input_specs,
    CalibrationSource,
    open_calibration,
    _random_source,
    _input_range,
    _folder_source,
    _single_npz_source,
    _load_npz,
    _npz_sample,
    _check_array,
    _image_target,
    read_image,
    resize_image,
    image_to_input,
    _per_channel,
    NafixCalibrationReader,
    _reader,
    _FeedsReader,
)
from .checks import (  # noqa: F401
    WEIGHT_OPS,
    ISLAND_CONSTRAINTS,
    _weight_axis,
    check_npu_quantization,
    check_finite_constants,
    non_finite_constants,
    _analysis_copy,
    float_islands,
)
from .ort import (  # noqa: F401
    ST_RECIPE_TEXT,
    MIN_PER_CHANNEL_OPSET,
    ort_default_op_types,
    npu_op_types,
    _prelu_slope_overrides,
    _grouped_conv_transpose_overrides,
    _calibration_method,
    _merge_every,
    _run_quantize_static,
    _with_shapes,
    QuantizeResult,
    quantize_float_model,
    _convert_opset,
    _check_interface,
)
from .uint8 import (  # noqa: F401
    EXACT_SHIFT_OPS,
    Uint8Conversion,
    convert_uint8_to_int8,
    convert_uint8_graph,
    _scalar_or_list,
    _tensor_types,
    _reaches_dequantize,
    _first_dq_params,
    _last_q_params,
    _agree,
    _uint8_or_asym_weights,
    _uint8_plain_constants,
    _requantize_weight,
    _dequantize,
    _requantize_bias,
    symmetric_output_params,
)
from .islands import (  # noqa: F401
    _QUANT_REASONS,
    IslandResult,
    island_nodes,
    requantize_islands,
    _island_result,
    _op_of,
    _ort_shared_param_ops,
    _share_input_params,
    _qdq_signature,
    _collapse_requantize_chains,
)
from .accuracy import (  # noqa: F401
    QuantAccuracy,
    _session,
    accuracy_report,
    _compare,
    _ProbeRunner,
    _match_by_qdq,
)
