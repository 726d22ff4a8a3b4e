"""``omni-edge export``: a PyTorch module, a transformers model directory or an ONNX
file made into a complete, validated exported artifact (``omni-edge.export/1``).

``sources`` turns each kind of source into one fp32 ONNX graph plus its example,
calibration and reference data; ``build`` derives the other precisions, measures
them, writes the artifact in a temporary directory beside the target, validates
it and renames it into place. docs/export.md is the walk-through.
"""
