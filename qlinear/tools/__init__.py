"""Model tools built on qlinear's kernels: loading and checking models, comparing with
onnxruntime, onnxruntime's 16-bit saturation, conformance, tables and progress bars.

These modules need ``onnx`` (and, for comparison, ``onnxruntime``): ``pip install qlinear[tools]``.
"""
