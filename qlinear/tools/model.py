"""Loading and checking models and inputs, with one-line errors.

Everything a user can get wrong raises :class:`ToolError` with one readable sentence: a
missing file, a pipe or device instead of a regular file, a file above protobuf's 2 GiB, a
file that is not ONNX, a truncated or corrupt protobuf, strings that are not UTF-8, element
types ONNX does not define, embedded tensors whose data does not match their shape, external
data that points outside the model's folder or has a malformed offset or length, tensors
declared larger than the memory limit, inputs missing or of the wrong name, dtype or shape, a
malformed ``--input`` or ``--shape`` argument.

Lenient where onnxruntime is: sparse initializers are expanded to dense ones, dimensions
declared negative are dynamic, and IR-3 models whose initializers are not graph inputs pass
the checker under IR 4's rule.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

import numpy as np
import onnx
from onnx import helper

from qlinear import modelfile
from qlinear.backend import check_model, format_problems, topologically_sorted
from qlinear.graph.proto import graph_tensors, topological_order
from qlinear.modelfile import MAX_MODEL_FILE_BYTES, ModelFileError  # noqa: F401 (re-exported)
from qlinear.modelfile import human as _human
from qlinear.tools import arrayfile
from qlinear.tools.files import OutputError, output_dir
from qlinear.tools.files import write_file as guarded_write

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


def _check_elem_types_and_strings(model: onnx.ModelProto, path: str) -> None:
    """:func:`qlinear.modelfile.check_contents` (element types, UTF-8 strings, attribute
    types: the checks qlinear.backend.prepare runs too) as one ToolError."""
    try:
        modelfile.check_contents(model, path)
    except ModelFileError as e:
        raise ToolError(str(e)) from None


def _check_tensor_data(model: onnx.ModelProto, path: str) -> None:
    """Every embedded tensor holds as much data as its shape says
    (:func:`qlinear.modelfile.tensor_data_problem`)."""
    for t in graph_tensors(model.graph):
        problem = modelfile.tensor_data_problem(t)
        if problem:
            raise ToolError(f"{path}: {problem}")


def _densify_sparse_initializers(model: onnx.ModelProto, path: str, max_bytes: int) -> None:
    """:func:`qlinear.modelfile.densify_sparse_initializers`, its error a ToolError."""
    try:
        modelfile.densify_sparse_initializers(model, path, max_bytes, "--max-tensor-bytes")
    except ModelFileError as e:
        raise ToolError(str(e)) from None


def _check_declared_sizes(model: onnx.ModelProto, max_bytes: int) -> None:
    g = model.graph
    for t in graph_tensors(g):
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
    known |= {o for node in g.node for o in node.output}  # listed in any order (as onnxruntime)
    for node in g.node:
        for name in node.input:
            if name not in known:
                raise ToolError(f"{path}: invalid or truncated model: node "
                                f"{node.name or node.op_type!r} reads {name!r}, which nothing "
                                "produces")
    try:
        topological_order(g.node)
    except ValueError as e:
        raise ToolError(f"{path}: invalid model: {e}") from None
    for o in g.output:
        if o.name not in known:
            raise ToolError(f"{path}: invalid or truncated model: graph output {o.name!r} is "
                            "not produced by any node")


def load_model(path: str, *, max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> onnx.ModelProto:
    """Load an ONNX model file and check its structure and sizes. The file is read by the one
    model loader :mod:`qlinear.modelfile` (a regular file only, never above protobuf's 2 GiB;
    external data only from the model's folder, its sizes checked before reading), as
    ``qlinear.backend.prepare(path)`` reads it. (onnx's checker: :func:`validate_model`.)"""
    try:
        data = modelfile.read_bytes(path)
        if not data:
            raise ToolError(f"{path}: empty file, not an ONNX model")
        model = modelfile.parse(data, f"{path}: this file is")
    except ModelFileError as e:
        raise ToolError(str(e)) from None
    if not model.ir_version:
        raise ToolError(f"{path}: not an ONNX model (no ir_version; corrupt or truncated?)")
    _check_elem_types_and_strings(model, path)
    _check_declared_sizes(model, max_tensor_bytes)
    _check_tensor_data(model, path)
    try:  # before densifying: onnx's to_array reads external data relative to the current
        # directory, never the model's folder
        modelfile.load_external_data(model, os.path.dirname(os.path.abspath(path)),
                                     max_tensor_bytes)
    except ModelFileError as e:
        raise ToolError(str(e)) from None
    _densify_sparse_initializers(model, path, max_tensor_bytes)
    _check_structure(model, path)
    return model


def validate_model(model: onnx.ModelProto, path: str) -> None:
    """onnx's checker, as a one-line ToolError (run after :func:`check_supported`, so that an
    unsupported model gets the full list of unsupported nodes rather than the checker's first
    complaint)."""
    checked = model
    if 0 < model.ir_version < 4 and _initializers_outside_inputs(model):
        # IR 3 required every initializer to be listed as a graph input; onnxruntime (and
        # onnx.reference) run such models anyway, and onnxruntime's quantizer keeps IR 3 when
        # it adds initializers. Check the rest of the model under IR 4's rule instead.
        checked = onnx.ModelProto()
        checked.CopyFrom(model)
        checked.ir_version = 4
    if _values_without_shape(checked.graph):
        # A graph input or output whose tensor type has no shape field (onnx.helper's
        # make_tensor_value_info(name, type, None)): the checker requires the field, while
        # onnxruntime and onnx.reference run the model (the shape is simply unknown). Check
        # a copy where those types carry an empty shape field: the checker needs the field
        # only, it runs no shape inference here (the model that runs is not changed).
        if checked is model:
            checked = onnx.ModelProto()
            checked.CopyFrom(model)
        for vi in _values_without_shape(checked.graph):
            vi.type.tensor_type.shape.SetInParent()
    # Nodes listed out of topological order, which the checker refuses and onnxruntime sorts
    # and runs (as the backend does): checked in the order they run.
    checked = topologically_sorted(checked)
    try:
        onnx.checker.check_model(checked)
    except Exception as e:
        raise ToolError(f"{path}: invalid ONNX model: {_one_line(e)}") from None


def _values_without_shape(graph: onnx.GraphProto) -> list:
    return [vi for vi in list(graph.input) + list(graph.output)
            if vi.type.HasField("tensor_type") and not vi.type.tensor_type.HasField("shape")]


def _initializers_outside_inputs(model: onnx.ModelProto) -> bool:
    inputs = {i.name for i in model.graph.input}
    return any(t.name not in inputs for t in model.graph.initializer)


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def check_supported(model: onnx.ModelProto) -> None:
    """ToolError listing every node qlinear cannot run exactly."""
    problems = check_model(model)
    if problems:
        raise ToolError(describe_problems(problems))


def describe_problems(problems) -> str:
    """One line: model-level problems (opset) first, then every unsupported node counted,
    grouped by reason and operator (:func:`qlinear.backend.format_problems`)."""
    return format_problems(problems)


# --------------------------------------------------------------------------- inputs


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _declared(vi: onnx.ValueInfoProto):
    """(numpy dtype or None, shape list with None for symbolic dims, or None). A dimension
    declared negative (exporters write -1) is dynamic, as onnxruntime treats it."""
    tt = vi.type.tensor_type
    dtype = None
    if tt.elem_type:
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except KeyError:
            raise ToolError(f"input {vi.name!r} has element type {tt.elem_type}, which is not "
                            "an ONNX element type") from None
    shape = None
    if tt.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None
                 for d in tt.shape.dim]
    return dtype, shape


def parse_shape_args(args: Iterable[str] | None) -> dict[str, list[int]]:
    """``NAME=1x3x224x224`` (``--shape``): the shape of a generated input, fixing its
    symbolic dimensions. A scalar is ``NAME=`` (no dimensions)."""
    shapes: dict[str, list[int]] = {}
    for arg in args or []:
        name, sep, text = arg.partition("=")
        if not sep or not name:
            raise ToolError(f"--shape {arg!r}: expected NAME=DIMxDIMx... (e.g. x=1x3x224x224)")
        if name in shapes:
            raise ToolError(f"--shape {name!r} given twice")
        dims = []
        for part in text.replace(",", "x").split("x") if text else []:
            if not part.strip().isdigit():
                raise ToolError(f"--shape {arg!r}: {part!r} is not a non-negative whole number "
                                "(expected NAME=DIMxDIMx..., e.g. x=1x3x224x224)")
            dims.append(int(part))
        shapes[name] = dims
    return shapes


def parse_input_args(args: Iterable[str] | None, *,
                     max_tensor_bytes: int | None = DEFAULT_MAX_TENSOR_BYTES) -> dict[str, np.ndarray]:
    """``NAME=FILE.npy`` (or ``NAME=FILE.npz``, the array NAME or its only array), or
    ``FILE.npz`` holding every input by name. Every array's header is read and its declared
    size checked against ``max_tensor_bytes`` before anything is allocated
    (:mod:`qlinear.tools.arrayfile`)."""
    feeds: dict[str, np.ndarray] = {}
    for arg in args or []:
        if "=" not in arg and arg.endswith(".npz"):
            for name, arr in load_inputs_npz(arg, max_tensor_bytes=max_tensor_bytes).items():
                if name in feeds:
                    raise ToolError(f"--input {name!r} given twice")
                feeds[name] = arr
            continue
        if "=" not in arg:
            raise ToolError(f"--input {arg!r}: expected NAME=FILE.npy, or FILE.npz holding "
                            "every input by name (as --save-inputs writes)")
        name, file = arg.split("=", 1)
        if not name or not file:
            raise ToolError(f"--input {arg!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise ToolError(f"--input {name!r} given twice")
        loaded = _load_array_file(f"--input {name}: {file}", file, max_tensor_bytes)
        if isinstance(loaded, dict):
            keys = list(loaded)
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
    # A .npy written on a big-endian machine (or with dtype '>f4') holds the declared element
    # type in the other byte order: converted to native order (a copy), as qlinear's operators
    # and qlinear.backend convert such arrays; the dtype check and onnxruntime then see it as is.
    return {k: a.astype(a.dtype.newbyteorder("=")) if a.dtype.names is None and not a.dtype.isnative else a
            for k, a in feeds.items()}


def _check_input_file(what: str, file: str) -> None:
    if not os.path.exists(file):
        raise ToolError(f"{what}: no such file")
    if not os.path.isfile(file):  # a folder, a FIFO, /dev/zero: never read
        raise ToolError(f"{what}: not a regular file")


def _load_array_file(what: str, file: str, max_tensor_bytes: int | None):
    """:func:`qlinear.tools.arrayfile.load` with its errors as one ToolError."""
    _check_input_file(what, file)
    try:
        return arrayfile.load(file, what, max_tensor_bytes)
    except ValueError as e:  # ArrayFileError, ModelFileError (a file swapped since the check)
        raise ToolError(str(e)) from None


def load_inputs_npz(file: str, *, max_tensor_bytes: int | None = DEFAULT_MAX_TENSOR_BYTES
                    ) -> dict[str, np.ndarray]:
    """Every array of an .npz by name (``--input FILE.npz``, the file ``--save-inputs`` writes),
    each member's declared size checked before it is loaded."""
    loaded = _load_array_file(f"--input {file}", file, max_tensor_bytes)
    if not isinstance(loaded, dict):
        raise ToolError(f"--input {file}: not a NumPy .npz file")
    return loaded


def save_inputs(out_dir: str, feeds: dict[str, np.ndarray]) -> str:
    """Write ``feeds`` to OUT_DIR/inputs.npz (array names = input names); returns the path.
    ``--input OUT_DIR/inputs.npz`` reads them back, so a run or comparison can be repeated.
    Written as every output is (:mod:`qlinear.tools.files`): never through a link."""
    folder = make_output_dir(out_dir, "--save-inputs")
    path = os.path.join(folder, "inputs.npz")
    write_file("--save-inputs", out_dir, path,
               lambda f: np.savez(f, **{k: np.asarray(v) for k, v in feeds.items()}))
    return path


def write_file(flag: str, out_dir: str, path: str, write: Callable[[Any], Any]) -> None:
    """``write(f)`` (``f`` a binary file object) through the guarded atomic writer
    :func:`qlinear.tools.files.write_file`: a link, folder, pipe or device at ``path`` is
    refused, and any failure is one ToolError naming the flag, the file and the reason."""
    try:
        guarded_write(flag, out_dir, path, write)
    except OutputError as e:
        raise ToolError(str(e)) from None


def make_output_dir(out_dir: str, flag: str) -> str:
    """The normalized folder ``out_dir`` (``a/../b`` is ``b``), created if missing: only that
    folder, never the intermediate ones the unnormalized path spells out, and only inside an
    existing parent; an empty name is refused (:func:`qlinear.tools.files.output_dir`)."""
    try:
        return output_dir(out_dir, flag)
    except OutputError as e:
        raise ToolError(str(e)) from None


def overridable_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that have an initializer: a default value a run may replace (IR 4 and
    later; onnxruntime and qlinear.backend accept a value for them, the initializer otherwise)."""
    if model.ir_version < 4:  # IR 3 lists every initializer among the inputs: constants
        return []
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name in inits]


def check_inputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """ToolError unless ``feeds`` has exactly the model's inputs (and, optionally, inputs with a
    default initializer) with their dtypes and shapes."""
    declared = {vi.name: _declared(vi) for vi in graph_inputs(model)}
    defaults = {vi.name: _declared(vi) for vi in overridable_inputs(model)}
    unknown = [n for n in feeds if n not in declared and n not in defaults]
    if unknown:
        raise ToolError(f"unknown input{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}; the model's inputs are "
                        f"{', '.join(map(repr, declared)) or '(none)'}"
                        + (f" (with a default that --input may replace: {', '.join(map(repr, defaults))})"
                           if defaults else ""))
    missing = [n for n in declared if n not in feeds]
    if missing:
        raise ToolError(f"missing input{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(map(repr, missing))} (give --input NAME=FILE.npy)")
    for name, (dtype, shape) in {**declared, **{n: d for n, d in defaults.items() if n in feeds}}.items():
        arr = feeds[name]
        if dtype is not None and arr.dtype != dtype:
            raise ToolError(f"input {name!r} has dtype {arr.dtype}, the model declares {dtype}")
        if shape is not None:
            ok = arr.ndim == len(shape) and all(d is None or d == s for d, s in zip(shape, arr.shape))
            if not ok:
                want = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
                raise ToolError(f"input {name!r} has shape {list(arr.shape)}, the model declares "
                                f"{want}")


def random_inputs(model: onnx.ModelProto, seed: int = 0, *,
                  shapes: dict[str, list[int]] | None = None,
                  given: Iterable[str] = (),
                  max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES) -> dict[str, np.ndarray]:
    """Seeded random inputs for the declared inputs not in ``given``: the shape from
    ``shapes`` (``--shape``) where given, which must agree with the declared rank and fixed
    dimensions; otherwise the declared shape, symbolic or dynamic dimensions set to 1."""
    if seed < 0:
        raise ToolError(f"--seed {seed}: must be 0 or more")
    shapes = dict(shapes or {})
    given = set(given)
    inputs = graph_inputs(model)
    names = [vi.name for vi in inputs]
    for name in shapes:
        if name not in names:
            raise ToolError(f"--shape {name}: the model has no input {name!r}; its inputs are "
                            f"{', '.join(map(repr, names)) or '(none)'}")
        if name in given:
            raise ToolError(f"--shape {name}: that input is given by --input (--shape sets "
                            "the shape of generated inputs)")
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in inputs:
        if vi.name in given:
            continue
        dtype, shape = _declared(vi)
        if dtype is not None and (dtype == np.dtype(object) or dtype.kind in "SUV"):
            # ONNX's string type maps to NumPy's object dtype: name the model's type, not NumPy's
            kind = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type).lower()
            raise ToolError(f"input {vi.name!r} is {kind}: no random values for it; give it "
                            "with --input NAME=FILE.npy")
        if dtype is None or (shape is None and vi.name not in shapes):
            raise ToolError(f"input {vi.name!r} has no declared type and shape; give it with "
                            "--input NAME=FILE.npy" + ("" if dtype is None else
                                                       f" or --shape {vi.name}=DIMxDIM..."))
        if vi.name in shapes:
            want = shapes[vi.name]
            if shape is not None and (len(want) != len(shape) or any(
                    d is not None and d != w for d, w in zip(shape, want))):
                decl = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
                raise ToolError(f"--shape {vi.name}={'x'.join(map(str, want))}: the model "
                                f"declares {decl} (rank and fixed dimensions must agree)")
            shape = list(want)
        shape = [1 if d is None else d for d in shape]
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > max_tensor_bytes:
            raise ToolError(f"input {vi.name!r} of shape {shape} would take {_human(need)}, more "
                            f"than the limit of {_human(max_tensor_bytes)} (--max-tensor-bytes)")
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
    """A file name inside ``out_dir`` for a tensor (path separators and dots neutralized): the
    folder's real path joined with the name, the name itself not resolved (a link of that name
    is refused when written, never followed)."""
    clean = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in tensor_name).lstrip(".")
    clean = clean or "tensor"
    base = os.path.realpath(out_dir)
    path = os.path.join(base, clean + suffix)
    if os.path.dirname(path) != base:  # cannot happen after cleaning; belt and braces
        raise ToolError(f"refusing to write {tensor_name!r} outside {out_dir}")
    return path
