"""``qlinear bench``: qlinear against onnxruntime and onnx.reference, operator by operator.

Run it as ``qlinear bench``, ``python -m qlinear.tools.bench`` or ``python benchmarks/run.py``
(docs/benchmarks.md says how to read the results). One file per job:

- ``cases.py``: the case catalogue (one ONNX operator on shapes from ResNet-50, MobileNetV2,
  BERT-base) and the one-node models and qlinear callables each case builds;
- ``run.py``: timing one case, interleaved: qlinear's prepared form (weights packed once, as
  onnxruntime prepacks initializers), qlinear's plain function, onnxruntime's one-node session
  (same threads, spinning off), then onnx.reference within a time budget; noisy rounds marked;
- ``inmodel.py``: ``--in-model``, convolutions against onnxruntime's kernel as a model runs it
  (its profiler's kernel time, without the one-node session's layout transposes);
- ``memory.py``: the peak extra memory of one call (resident-set high-water mark);
- ``machine.py``: the machine's description and its int8 peak, measured with qlinear's own
  micro-kernels, repeated, and refused when implausible;
- ``report.py``: summary, results.md, machine.md, the chart;
- ``noamx.py``: ``--no-amx``, a child process denied AMX before either runtime detects the CPU;
- ``command.py``: the command line and the run.

Outputs (in ``--output-dir``): ``results.md`` (summary and table), ``results.json``,
``results.png`` (chart, with matplotlib) and ``machine.md``.
"""

from __future__ import annotations

from .command import main

__all__ = ["main"]
