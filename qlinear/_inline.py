"""The size of a model once its model-local functions are inlined, counted before inlining.

A function may call other functions, each call expanding into the callee's whole body: a few
dozen functions each calling the previous one twice inline to 2^39 nodes (onnx's inliner, in
C++, then runs for minutes and grows past gigabytes, beyond the reach of ``--timeout``). The
count here walks each function's body once (memoized), so it costs the size of the model as
written, and :func:`check_inline_size` refuses a model whose inlined graph would exceed
:data:`MAX_INLINED_NODES` before anything is expanded. A function that calls itself, directly
or through others, can never be inlined and is refused too.
"""

from __future__ import annotations

import sys
from typing import Iterable

import onnx
from onnx.inliner import inline_local_functions

from qlinear.graph.proto import subgraphs

#: Most nodes a model may have once its functions are inlined (nodes of subgraphs counted
#: too). Far above real models (ResNet-50: about 200 nodes; a large transformer: tens of
#: thousands), and small enough that inlining and preparing take seconds and a few hundred
#: MiB at most.
MAX_INLINED_NODES = 1_000_000


def _key(domain: str, name: str, overload: str = "") -> tuple[str, str, str]:
    return (domain if domain != "ai.onnx" else "", name, overload)


def inlined_size(model: onnx.ModelProto, limit: int | None = None) -> int:
    """The number of nodes the model's main graph (and its subgraphs) holds once every call
    of a model-local function is replaced by the function's body, recursively. Counting stops
    early once it passes ``limit`` (the value returned is then above ``limit``). ValueError
    naming the function when functions call each other in a cycle."""
    functions = {_key(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    sizes: dict[tuple[str, str, str], int] = {}
    active: list[tuple[str, str, str]] = []
    cap = limit + 1 if limit is not None else None

    def clip(n: int) -> int:  # keep numbers small: 2^39 as a Python int is fine, 2^10^6 is not
        return min(n, cap) if cap is not None else n

    def nodes_size(nodes: Iterable[onnx.NodeProto]) -> int:
        total = 0
        for node in nodes:
            callee = _key(node.domain, node.op_type, getattr(node, "overload", ""))
            total += function_size(callee) if callee in functions else 1
            for g in subgraphs(node):
                total += nodes_size(g.node)
            total = clip(total)
            if cap is not None and total >= cap:
                break
        return total

    def function_size(key: tuple[str, str, str]) -> int:
        if key in sizes:
            return sizes[key]
        if key in active:
            cycle = " -> ".join(k[1] for k in active[active.index(key):] + [key])
            raise ValueError(f"the model-local functions call each other in a cycle ({cycle}); "
                             "a recursive function cannot be inlined")
        active.append(key)
        try:
            sizes[key] = nodes_size(functions[key].node)
        finally:
            active.pop()
        return sizes[key]

    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, 10_000))  # functions nested a few thousand deep
    try:
        return nodes_size(model.graph.node)
    except RecursionError:
        raise ValueError("the model-local functions (or subgraphs) nest too deeply to "
                         "inline") from None
    finally:
        sys.setrecursionlimit(depth)


def check_inline_size(model: onnx.ModelProto, limit: int = MAX_INLINED_NODES) -> None:
    """ValueError when inlining the model's functions would produce more than ``limit``
    nodes, or when they call each other in a cycle; nothing is expanded."""
    if not model.functions:
        return
    n = inlined_size(model, limit)
    if n > limit:
        raise ValueError(f"inlining them would produce more than {limit:,} "
                         f"nodes (the limit, qlinear._inline.MAX_INLINED_NODES): functions "
                         "calling other functions several times multiply their size")


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions (FunctionProto) inlined, so that the six
    operators inside them run on qlinear's kernels too (onnx.reference would otherwise run
    a function's body with its own implementations); ``model`` itself if it has none.
    ValueError, before anything is expanded, when the inlined graph would exceed
    :data:`MAX_INLINED_NODES` nodes or the functions call each other in a cycle."""
    if not model.functions:
        return model
    check_inline_size(model)
    return inline_local_functions(model)
