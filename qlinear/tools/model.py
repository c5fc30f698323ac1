"""Loading and checking models and inputs, with one-line errors.

Everything a user can get wrong raises :class:`ToolError` with one readable sentence: a
missing file, a file that is not ONNX, a truncated or corrupt protobuf, external data that
points outside the model's folder, tensors declared larger than the memory limit, inputs
missing or of the wrong name, dtype or shape, a malformed ``--input`` argument.
"""

from __future__ import annotations

import os
from typing import Iterable

import numpy as np

import onnx
from onnx import helper

#: Default limit on any one declared tensor (initializer, input, intermediate with a static
#: shape), in bytes. ``--max-tensor-bytes`` changes it.
DEFAULT_MAX_TENSOR_BYTES = 2 * 1024**3


class ToolError(Exception):
    """A user error: the command prints ``qlinear: error: <message>`` and exits with 2."""


# --------------------------------------------------------------------------- model


def _tensor_nbytes(dims: Iterable[int], elem_type: int) -> int:
    n = 1
    for d in dims:
        n *= max(int(d), 0)
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except Exception:
        itemsize = 8
    return n * itemsize


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _all_tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.TENSORS:
                yield from a.tensors
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_tensors(g)


def _check_external_data(model: onnx.ModelProto, base_dir: str, max_bytes: int) -> None:
    base = os.path.realpath(base_dir)
    for t in _all_tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        if not loc:
            raise ToolError(f"tensor {t.name!r}: external data without a location")
        if os.path.isabs(loc) or loc.startswith(("/", "\\")) or ".." in loc.replace("\\", "/").split("/"):
            raise ToolError(f"tensor {t.name!r}: external data path {loc!r} points outside the "
                            "model's folder")
        path = os.path.realpath(os.path.join(base, loc))
        if os.path.commonpath([base, path]) != base:
            raise ToolError(f"tensor {t.name!r}: external data path {loc!r} points outside the "
                            "model's folder")
        if not os.path.isfile(path):
            raise ToolError(f"tensor {t.name!r}: external data file {loc!r} not found")
        offset = int(info.get("offset", 0) or 0)
        need = _tensor_nbytes(t.dims, t.data_type)
        length = int(info.get("length", need) or need)
        if need > max_bytes:
            raise ToolError(f"tensor {t.name!r} declares {_human(need)}, more than the limit "
                            f"of {_human(max_bytes)} (--max-tensor-bytes)")
        if offset + length > os.path.getsize(path):
            raise ToolError(f"tensor {t.name!r}: external data file {loc!r} is shorter than "
                            "the tensor it should hold (truncated?)")


def _check_declared_sizes(model: onnx.ModelProto, max_bytes: int) -> None:
    g = model.graph
    for t in _all_tensors(g):
        n = _tensor_nbytes(t.dims, t.data_type)
        if n > max_bytes:
            raise ToolError(f"tensor {t.name!r} declares {_human(n)}, more than the limit of "
                            f"{_human(max_bytes)} (--max-tensor-bytes)")
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        dims = [d.dim_value for d in tt.shape.dim]
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            n = _tensor_nbytes(dims, tt.elem_type)
            if n > max_bytes:
                raise ToolError(f"tensor {vi.name!r} declares shape {dims} ({_human(n)}), more "
                                f"than the limit of {_human(max_bytes)} (--max-tensor-bytes)")


def _check_structure(model: onnx.ModelProto, path: str) -> None:
    """Checks that catch files that parse as protobuf but are not (whole) ONNX models."""
    g = model.graph
    if not model.HasField("graph") or (not g.node and not g.output):
        raise ToolError(f"{path}: not an ONNX model (no graph)")
    if not model.opset_import:
        raise ToolError(f"{path}: not a valid ONNX model (no opset_import)")
    known = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    known |= {i.name for i in g.sparse_initializer}
    for node in g.node:
        for name in node.input:
            if name not in known:
                raise ToolError(f"{path}: invalid or truncated model: node "
                                f"{node.name or node.op_type!r} reads {name!r}, which nothing "
                                "produces")
        known.update(node.output)
    for o in g.output:
        if o.name not in known:
            raise ToolError(f"{path}: invalid or truncated model: graph output {o.name!r} is "
                            "not produced by any node")


def load_model(path: str, *, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> onnx.ModelProto:
    """Load an ONNX model file and check its structure and sizes; external data is read only
    from the model's folder. (onnx's checker: :func:`validate_model`.)"""
    if not os.path.exists(path):
        raise ToolError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ToolError(f"{path}: is a directory, not an ONNX model file")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise ToolError(f"{path}: empty file, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:
        raise ToolError(f"{path}: not an ONNX model, or a corrupt or truncated protobuf") from None
    if not model.ir_version:
        raise ToolError(f"{path}: not an ONNX model (no ir_version; corrupt or truncated?)")
    _check_structure(model, path)
    _check_declared_sizes(model, max_tensor_bytes)
    base = os.path.dirname(os.path.abspath(path))
    _check_external_data(model, base, max_tensor_bytes)
    try:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, base)
    except Exception as e:
        raise ToolError(f"{path}: cannot read external data: {_one_line(e)}") from None
    return model


def validate_model(model: onnx.ModelProto, path: str) -> None:
    """onnx's checker, as a one-line ToolError (run after :func:`check_supported`, so that an
    unsupported model gets the full list of unsupported nodes rather than the checker's first
    complaint)."""
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise ToolError(f"{path}: invalid ONNX model: {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def check_supported(model: onnx.ModelProto) -> None:
    """ToolError listing every node qlinear cannot run exactly."""
    from qlinear.backend import check_model

    problems = check_model(model)
    if problems:
        raise ToolError(describe_problems(problems))


def describe_problems(problems) -> str:
    """'N unsupported nodes: ...' with model-level problems (opset) first."""
    model_level = [str(p) for p in problems if p.node == "(model)"]
    nodes = [str(p) for p in problems if p.node != "(model)"]
    parts = model_level[:]
    if nodes:
        n = len(nodes)
        parts.append(f"{n} unsupported node{'s' if n > 1 else ''}: " + "; ".join(nodes))
    return "; ".join(parts)


# --------------------------------------------------------------------------- inputs


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _declared(vi: onnx.ValueInfoProto):
    """(numpy dtype or None, shape list with None for symbolic dims, or None)."""
    tt = vi.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return dtype, shape


def parse_input_args(args: Iterable[str] | None) -> dict[str, np.ndarray]:
    """``NAME=FILE.npy`` (or ``NAME=FILE.npz``, the array NAME or its only array)."""
    feeds: dict[str, np.ndarray] = {}
    for arg in args or []:
        if "=" not in arg:
            raise ToolError(f"--input {arg!r}: expected NAME=FILE.npy")
        name, file = arg.split("=", 1)
        if not name or not file:
            raise ToolError(f"--input {arg!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise ToolError(f"--input {name!r} given twice")
        if not os.path.isfile(file):
            raise ToolError(f"--input {name}: {file}: no such file")
        try:
            loaded = np.load(file, allow_pickle=False)
        except Exception:
            raise ToolError(f"--input {name}: {file}: not a NumPy .npy/.npz file") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                keys = list(loaded.keys())
                if name in keys:
                    arr = loaded[name]
                elif len(keys) == 1:
                    arr = loaded[keys[0]]
                else:
                    raise ToolError(f"--input {name}: {file} holds {len(keys)} arrays "
                                    f"({', '.join(keys)}) and none is named {name!r}")
        else:
            arr = loaded
        feeds[name] = arr
    return feeds


def check_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """ToolError unless ``feeds`` has exactly the model's inputs with their dtypes and shapes."""
    declared = {vi.name: _declared(vi) for vi in graph_inputs(model)}
    unknown = [n for n in feeds if n not in declared]
    if unknown:
        raise ToolError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}; the model's inputs are "
                        f"{', '.join(map(repr, declared)) or '(none)'}")
    missing = [n for n in declared if n not in feeds]
    if missing:
        raise ToolError(f"missing input{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(repr, missing))} (give --input NAME=FILE.npy)")
    for name, (dtype, shape) in declared.items():
        arr = feeds[name]
        if dtype is not None and arr.dtype != dtype:
            raise ToolError(f"input {name!r} has dtype {arr.dtype}, the model declares {dtype}")
        if shape is not None:
            ok = arr.ndim == len(shape) and all(d is None or d == s for d, s in zip(shape, arr.shape))
            if not ok:
                want = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
                raise ToolError(f"input {name!r} has shape {list(arr.shape)}, the model declares "
                                f"{want}")


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for the declared inputs (symbolic dimensions become 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in graph_inputs(model):
        dtype, shape = _declared(vi)
        if dtype is None or shape is None:
            raise ToolError(f"input {vi.name!r} has no declared type and shape; give it with "
                            "--input NAME=FILE.npy")
        shape = [1 if d is None else d for d in shape]
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            lo, hi = max(int(info.min), -128), min(int(info.max), 255)
            feeds[vi.name] = rng.integers(lo, hi + 1, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def safe_output_path(out_dir: str, tensor_name: str, suffix: str = ".npy") -> str:
    """A file name inside ``out_dir`` for a tensor (path separators and dots neutralized)."""
    clean = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in tensor_name).lstrip(".")
    clean = clean or "tensor"
    path = os.path.realpath(os.path.join(out_dir, clean + suffix))
    base = os.path.realpath(out_dir)
    if os.path.commonpath([base, path]) != base:  # cannot happen after cleaning; belt and braces
        raise ToolError(f"refusing to write {tensor_name!r} outside {out_dir}")
    return path
