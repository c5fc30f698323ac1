"""The graph runtime's errors: a model it cannot run (every problem listed), a node that failed."""

from __future__ import annotations

import dataclasses
from typing import Sequence


class UnsupportedModelError(ValueError):
    """The model has nodes qlinear cannot run exactly; ``problems`` lists all of them."""

    def __init__(self, problems: Sequence["Problem"]):
        self.problems = list(problems)
        super().__init__("prepare: " + format_problems(self.problems))


class NodeError(ValueError):
    """A node failed at run time; the message names node, operator and version."""


@dataclasses.dataclass(frozen=True)
class Problem:
    node: str
    op_type: str
    domain: str
    version: int | None
    reason: str

    def __str__(self) -> str:
        if self.node == "(model)":
            return self.reason
        op = self.op_type if not self.domain else f"{self.domain}.{self.op_type}"
        ver = f"-{self.version}" if self.version is not None else ""
        return f"node {self.node!r} ({op}{ver}): {self.reason}"


def format_problems(problems: Sequence[Problem], examples: int = 2) -> str:
    """One line for any number of problems: model-level ones first, then every unsupported
    node counted, grouped by reason and operator, largest groups first, e.g.
    ``143 unsupported nodes: com.microsoft.QLinearSigmoid x58, com.microsoft.QLinearMul x58
    (operator outside the standard ONNX domains; e.g. nodes 'a', 'b')``. Nothing is cut: the
    length grows with the number of distinct operators and reasons, not of nodes."""
    model_level = [p.reason for p in problems if p.node == "(model)"]
    nodes = [p for p in problems if p.node != "(model)"]
    parts = model_level[:]
    if nodes:
        # reason -> operator label -> node names, in first-seen order
        groups: dict[str, dict[str, list[str]]] = {}
        for p in nodes:
            op = p.op_type or "(empty op_type)"
            op = op if not p.domain else f"{p.domain}.{op}"
            op += f"-{p.version}" if p.version is not None else ""
            groups.setdefault(p.reason, {}).setdefault(op, []).append(p.node)
        order = sorted(groups.items(), key=lambda kv: -sum(map(len, kv[1].values())))
        texts = []
        for reason, ops in order:
            ops_sorted = sorted(ops.items(), key=lambda kv: -len(kv[1]))
            counted = ", ".join(f"{op} \u00d7{len(names)}" for op, names in ops_sorted)
            first = [names[0] for _, names in ops_sorted][:examples]
            eg = ", ".join(repr(n) for n in first)
            texts.append(f"{counted} ({reason}; e.g. node{'s' if len(first) > 1 else ''} {eg})")
        n = len(nodes)
        parts.append(f"{n} unsupported node{'s' if n != 1 else ''}: " + "; ".join(texts))
    return "; ".join(parts)
