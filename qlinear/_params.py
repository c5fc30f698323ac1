"""Scale / zero-point granularity: per tensor, per axis or blocked, as one broadcast layout.

ONNX's QuantizeLinear and DequantizeLinear (and the operators built on them) take parameters

- per tensor: one element (a scalar or any shape of size 1), whatever ``axis`` says;
- per axis: 1-D of length D = x.shape[axis] (negative axes allowed);
- blocked (``block_size`` B > 0, from version 21): the rank of x, x's shape except
  S[axis] = ceil(D / B); element i along the axis uses parameter i // B, so the last block may
  be partial.

All three are one layout here: x seen as (pre, D, post) around ``axis``, the parameters as
(P0, nblocks, P2) with P0 in {1, pre}, P2 in {1, post}, and a block length B (per tensor:
one block of D; per axis: B = 1). :func:`run` walks x in chunks of about ``CHUNK`` elements,
each covering whole blocks (viewed as (pre, nblocks, B, post) against parameters
(P0, nblocks, 1, P2): a broadcast, no copy) or a part of one block, so no chunk's temporaries
and nothing of the parameters is ever the size of the tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from . import _validate as v

#: elements per chunk: small enough that a chunk's temporaries (a few bytes to 8 per element)
#: stay far below the output of a large tensor, large enough that NumPy's per-call cost is small
CHUNK = 1 << 15


@dataclass(frozen=True)
class Layout:
    """How parameters map onto x: ``shape3`` = (pre, D, post), ``block`` = B, ``pshape`` =
    (P0, nblocks, P2), ``kind`` = "tensor", "axis" or "blocked", ``axis`` (None per tensor)."""

    kind: str
    axis: int | None
    shape3: tuple[int, int, int]
    block: int
    pshape: tuple[int, int, int]


def layout(op: str, name: str, x_shape: tuple[int, ...], p_shape: tuple[int, ...], axis: int,
           block_size: int) -> Layout:
    """The layout of a parameter of shape ``p_shape`` for x of ``x_shape``; a ValueError naming
    both shapes when it fits no granularity."""
    x_shape = tuple(int(d) for d in x_shape)
    p_shape = tuple(int(d) for d in p_shape)
    size = math.prod(x_shape)
    if block_size:
        if not x_shape:
            raise ValueError(f"{op}: {name} is blocked (block_size {block_size}) but x is 0-d")
        ax = v.axis_attribute(op, axis, len(x_shape))
        d = x_shape[ax]
        nb = -(-d // block_size)
        want = x_shape[:ax] + (nb,) + x_shape[ax + 1:]
        if p_shape != want:
            raise ValueError(
                f"{op}: {name} must have shape {want} for blocked quantization of x of shape {x_shape} "
                f"along axis {axis} with block_size {block_size} (ceil({d}/{block_size}) = {nb} blocks); "
                f"got shape {p_shape}"
            )
        pre, post = math.prod(x_shape[:ax]), math.prod(x_shape[ax + 1:])
        return Layout("blocked", ax, (pre, d, post), block_size, (pre, nb, post))
    if math.prod(p_shape) == 1:
        return Layout("tensor", None, (1, size, 1), max(size, 1), (1, 1, 1))
    if len(p_shape) != 1:
        raise ValueError(
            f"{op}: {name} must be a scalar, 1-D (per axis), or blocked with block_size > 0; "
            f"got shape {p_shape} for x of shape {x_shape} (block_size 0)"
        )
    if not x_shape:
        raise ValueError(f"{op}: {name} is per axis ({p_shape[0]} elements) but x is 0-d")
    ax = v.axis_attribute(op, axis, len(x_shape))
    if p_shape[0] != x_shape[ax]:
        raise ValueError(
            f"{op}: {name} has {p_shape[0]} elements but x has {x_shape[ax]} along axis {axis} "
            f"(x shape {x_shape})"
        )
    pre, d, post = math.prod(x_shape[:ax]), x_shape[ax], math.prod(x_shape[ax + 1:])
    return Layout("axis", ax, (pre, d, post), 1, (1, d, 1))


def as_layout(p: np.ndarray, lay: Layout) -> np.ndarray:
    """A parameter array reshaped (a view) to the layout's (P0, nblocks, P2)."""
    return p.reshape(lay.pshape)


def _units(lay: Layout, chunk: int):
    """(p-slice, k-slice along D, q-slice, whole_blocks) chunks covering (pre, D, post)."""
    pre, d, post = lay.shape3
    b = lay.block
    nb = lay.pshape[1]
    every = slice(None)
    if post >= chunk:
        for p in range(pre):
            for k in range(d):
                for q in range(0, post, chunk):
                    yield slice(p, p + 1), k, k + 1, slice(q, q + chunk), False
        return
    if b * post >= chunk:  # chunks inside one block
        step = max(1, chunk // post)
        for p in range(pre):
            for j in range(nb):
                end = min((j + 1) * b, d)
                for k in range(j * b, end, step):
                    yield slice(p, p + 1), k, min(k + step, end), every, False
        return
    nfull = d // b
    jstep = max(1, chunk // (b * post))
    if jstep >= nb:  # whole rows of D per chunk, several pre at once
        pstep = max(1, chunk // max(1, d * post))
        for p in range(0, pre, pstep):
            ps = slice(p, p + pstep)
            if nfull:
                yield ps, 0, nfull * b, every, True
            if nfull * b < d:
                yield ps, nfull * b, d, every, False
        return
    for p in range(pre):
        ps = slice(p, p + 1)
        for j in range(0, nfull, jstep):
            yield ps, j * b, min(j + jstep, nfull) * b, every, True
        if nfull * b < d:
            yield ps, nfull * b, d, every, False


def run(kernel: Callable[..., None], x: np.ndarray, out: np.ndarray, params: Sequence[np.ndarray],
        lay: Layout, chunk: int | None = None) -> None:
    """kernel(x_chunk, out_chunk, *param_chunks) over the whole of x, in chunks; each
    parameter chunk broadcasts against x's chunk (see the module notes). ``params`` are in
    the layout's (P0, nblocks, P2) shape, or (1, 1, 1) (one value for all); ``out`` is a
    C-contiguous array of x's shape."""
    chunk = CHUNK if chunk is None else chunk
    pre, d, post = lay.shape3
    if pre * d * post == 0:
        return
    x3 = x.reshape(lay.shape3)
    o3 = out.reshape(lay.shape3)
    b = lay.block
    for ps, k0, k1, qs, whole in _units(lay, chunk):
        xs = x3[ps, k0:k1, qs]
        os_ = o3[ps, k0:k1, qs]
        if whole:
            j0, j1 = k0 // b, k1 // b
            shape4 = (xs.shape[0], j1 - j0, b, xs.shape[2])
            xs = xs.reshape(shape4)
            os_ = os_.reshape(shape4)  # a view: o3 is contiguous and its D axis uniformly strided
            pv = [p[(ps if p.shape[0] > 1 else slice(None)), (slice(j0, j1) if p.shape[1] > 1 else slice(None)),
                    (qs if p.shape[2] > 1 else slice(None))][:, :, None, :]
                  for p in params]
        else:
            j = k0 // b
            pv = [p[(ps if p.shape[0] > 1 else slice(None)), (slice(j, j + 1) if p.shape[1] > 1 else slice(None)),
                    (qs if p.shape[2] > 1 else slice(None))]
                  for p in params]
        kernel(xs, os_, *pv)
