"""The Neural-ART NPU model: target profile, constraints, placement, epoch and memory estimates."""
