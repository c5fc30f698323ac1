"""The engines' shared configuration, read by every engine and by the operators whichever
engine runs: the scratch-memory bound of one operator call (the workspace limit).

The engines themselves are, for now, ``qlinear._engine`` and ``qlinear._elementwise`` (NumPy),
``qlinear._native`` (the C engine) and :mod:`qlinear.engines.ort_avx2` (onnxruntime's
saturating AVX2 arithmetic, for ``--emulate``).
"""

from __future__ import annotations

from .._validate import byte_count

_workspace_bytes = 256 << 20


def set_workspace_limit(nbytes: int) -> None:
    """Bound the scratch memory (im2col tiles, padded copies) one operator call may use."""
    global _workspace_bytes
    # the native engine takes the limit as a C ssize_t: at most 2**63 - 1
    _workspace_bytes = byte_count(nbytes, "set_workspace_limit: nbytes", "an integer in [1, 2**63 - 1]",
                                  most=(1 << 63) - 1)


def workspace_limit() -> int:
    """The current scratch-memory bound in bytes (default 256 MiB)."""
    return _workspace_bytes
