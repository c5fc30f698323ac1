"""What every replacement kernel of the graph runtime shares."""

from __future__ import annotations

from onnx.reference.op_run import OpRun

def constants_at(op: OpRun, positions: tuple[int, ...]) -> bool | None:
    """Whether every input of ``op``'s node at ``positions`` (those present and named) is a
    constant of the model: the same array object, never written, on every run, which is what
    lets a node keep what it derived from it. None while unknown (``constant_inputs`` not set
    by the backend's QLinearRep): nothing may then be kept across runs."""
    known = op.constant_inputs
    if known is None:
        return None
    names = op.onnx_node.input
    return all(names[i] in known for i in positions if i < len(names) and names[i])
