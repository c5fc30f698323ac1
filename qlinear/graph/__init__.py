"""The ONNX graph runtime over ``onnx.reference`` (its public face is :mod:`qlinear.backend`).

Bottom to top: ``errors`` and ``proto`` (leaves: exceptions, ONNX proto helpers), ``support``
(what can run, before anything runs), ``kernels/`` (the OpRun classes: the six operators,
float glue, com.microsoft, control flow, size guards), ``registry`` (the kernel lists),
``modes`` (QDQ fusion and emulation), ``evaluator`` (the lean graph loop), ``rep``
(:class:`QLinearRep`) and ``api`` (the onnx.backend API). Model files are read by the one
loader, :mod:`qlinear.modelfile`; model-local functions are inlined by :mod:`qlinear._inline`.
"""
