"""The native engine's side of the operators: validated operands and plans → the C module's
argument lists (``qlinear._qlnative``, loaded and selected by ``qlinear._native``).

One module per operator family (``conv``, ``matmul``, ``quantize``): weight packing, the
engine's limits for a call, the plan of a call (its C arguments) and ``run(plan, x)``. The
operators (``qlinear/conv.py``, ``matmul.py``, ``quantize.py``) validate, decide and cache
(``qlinear._prepared``); only these modules know how the engine takes its arguments.
"""
