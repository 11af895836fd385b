"""nafix: an ONNX pre-compiler and model fixer for the STM32N6 Neural-ART NPU."""

__version__ = "0.1.0"
