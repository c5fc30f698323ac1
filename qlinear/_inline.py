"""The size of a model once its model-local functions are inlined, counted before inlining.

A function may call other functions, each call expanding into the callee's whole body: a few
dozen functions each calling the previous one twice inline to 2^39 nodes (onnx's inliner, in
C++, then runs for minutes and grows past gigabytes, beyond the reach of ``--timeout``). The
count here walks each function's body once (memoized), so it costs the size of the model as
written, and :func:`check_inline_size` refuses, before anything is expanded, a model whose
inlined graph would be more than :data:`INLINE_BASE` nodes plus :data:`INLINE_FACTOR` times the
nodes the file holds (its graphs and its functions' bodies), or more than
:data:`MAX_INLINED_NODES` in any case. Preparing costs about 0.1 ms per node, so the work
inlining can add to a file is bounded by the file's own size: a small file cannot ask for
more than a second or two. A function that calls itself, directly or through others, can never
be inlined and is refused too.
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

#: Nodes inlining may produce beyond :data:`INLINE_FACTOR` times the nodes written: a model
#: whose few functions are each called a few times (layers, blocks) stays far below it, and
#: preparing 20,000 nodes takes a second or two.
INLINE_BASE = 20_000

#: How many times its written size inlining may make a model larger than :data:`INLINE_BASE`
#: (a real model calls each function about once per layer; 2^k fan-out is what is refused).
INLINE_FACTOR = 8


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


def written_size(model: onnx.ModelProto) -> int:
    """The nodes the model holds as written: its graph's, its subgraphs' and its functions'
    bodies' (each counted once, however often it is called)."""
    def count(nodes: Iterable[onnx.NodeProto]) -> int:
        return sum(1 + sum(count(g.node) for g in subgraphs(n)) for n in nodes)

    return count(model.graph.node) + sum(count(f.node) for f in model.functions)


def inline_limit(model: onnx.ModelProto) -> int:
    """Most nodes the model may have once inlined: :data:`INLINE_BASE` plus
    :data:`INLINE_FACTOR` times its written size, at most :data:`MAX_INLINED_NODES`."""
    return min(MAX_INLINED_NODES, INLINE_BASE + INLINE_FACTOR * written_size(model))


def check_inline_size(model: onnx.ModelProto, limit: int | None = None) -> None:
    """ValueError when inlining the model's functions would produce more than ``limit``
    nodes (default :func:`inline_limit`), or when they call each other in a cycle; nothing
    is expanded."""
    if not model.functions:
        return
    if limit is None:
        limit = inline_limit(model)
    n = inlined_size(model, limit)
    if n > limit:
        raise ValueError(f"inlining them would produce more than {limit:,} nodes from "
                         f"{written_size(model):,} written (the limit: {INLINE_BASE:,} plus "
                         f"{INLINE_FACTOR} times the nodes written, qlinear._inline): functions "
                         "calling other functions several times multiply their size")


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its model-local functions (FunctionProto) inlined, so that the six
    operators inside them run on qlinear's kernels too (onnx.reference would otherwise run
    a function's body with its own implementations); ``model`` itself if it has none.
    ValueError, before anything is expanded, when the inlined graph would exceed
    :func:`inline_limit` nodes or the functions call each other in a cycle; and when onnx's
    inliner refuses them (call chains deeper than 100: its ValidationError)."""
    if not model.functions:
        return model
    check_inline_size(model)
    try:
        return inline_local_functions(model)
    except Exception as e:  # onnx's ValidationError (call chains deeper than 100, ...)
        raise ValueError(f"the model-local functions cannot be inlined: "
                         f"{' '.join(str(e).split())}") from None
