"""The one model-file loader: ``qlinear.backend.prepare(path)`` and every ``qlinear`` command
read model files through :func:`load` (the commands add their own checks of the contents,
:func:`qlinear.tools.model.load_model`).

Nothing is read blindly:

- the model file must be a regular file (a FIFO would block forever, /dev/zero or
  /dev/urandom never end): it is opened without blocking and checked through its descriptor
  (``fstat``), so a file swapped after a check cannot slip through; it is read only up to the
  size it has, and never above protobuf's 2 GiB;
- external data is read only from the model's folder: no absolute path, no ``..``, no link
  resolving outside, only regular files, each offset and length whole numbers inside the
  file, each tensor's declared size checked against its element type before a byte is read
  and against the limit when one is given. The bytes are read here, through the same guarded
  open, not by onnx's helper (which opens whatever the path names);
- every failure is one :class:`ModelFileError` (a ValueError) naming the file or tensor and
  the reason; onnx's and protobuf's own exceptions (DecodeError, ValidationError) never
  reach the caller.
"""

from __future__ import annotations

import os
import stat

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor as F
from onnx import helper, numpy_helper

from qlinear import dtypes
from qlinear.graph.proto import graph_tensors, model_tensors, subgraphs
from qlinear.graph.proto import graphs as _graphs

#: Largest model file read (protobuf cannot parse a message of 2 GiB or more; bigger models
#: keep their weights in external data files).
MAX_MODEL_FILE_BYTES = 2 * 1024**3 - 1


class ModelFileError(ValueError):
    """A model file (or its external data) that cannot be read safely or is not ONNX."""


def human(n: float) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.5 KiB``, ..., ``4.0 TiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def open_regular(path: str, what: str, nofollow: bool = False):
    """(Also for --input array files, :mod:`qlinear.tools.arrayfile`.) A binary file object of the regular file ``path`` and its size; ModelFileError for
    anything else. Opened with O_NONBLOCK (a FIFO opens at once instead of waiting for a
    writer) and checked through the descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0))
    except FileNotFoundError:
        raise ModelFileError(f"{what}: no such file") from None
    except IsADirectoryError:
        raise ModelFileError(f"{what}: is a directory, not a file") from None
    except OSError as e:
        raise ModelFileError(f"{what}: cannot open ({e.strerror or e})") from None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        f.close()
        raise ModelFileError(f"{what}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise ModelFileError(f"{what}: not a regular file (a pipe, socket or device)")
    return f, st.st_size


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the model file ``path``: a regular file of at most
    :data:`MAX_MODEL_FILE_BYTES` (see the module's docstring)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory, not an ONNX model file")
    f, size = open_regular(path, path)
    with f:
        if size > MAX_MODEL_FILE_BYTES:
            raise ModelFileError(f"{path}: {human(size)}, larger than the largest model file "
                                 f"protobuf can parse ({human(MAX_MODEL_FILE_BYTES)}); keep the "
                                 "weights in external data")
        # read(n) allocates n bytes before reading: ask for the size the file has (and one
        # byte more, to notice a file that grows), never blindly for the 2 GiB cap
        try:  # (a "regular" file that fails to read: /proc/self/mem's EIO)
            chunks = [f.read(size + 1)]
            read = len(chunks[0])
            while read > size and read <= MAX_MODEL_FILE_BYTES:  # it grew while being read
                chunk = f.read(min(64 << 20, MAX_MODEL_FILE_BYTES + 1 - read))
                if not chunk:
                    break
                chunks.append(chunk)
                read += len(chunk)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if len(data) > MAX_MODEL_FILE_BYTES:
        raise ModelFileError(f"{path}: grew past {human(MAX_MODEL_FILE_BYTES)} while being read")
    return data


def parse(data: bytes, what: str) -> onnx.ModelProto:
    """``data`` parsed as a ModelProto; ModelFileError (not protobuf's DecodeError) if it is
    not one. ``what`` names the source in the message (a quoted path, or "the bytes are")."""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # google.protobuf.message.DecodeError, RuntimeWarning-free
        raise ModelFileError(f"{what} not an ONNX model, or a corrupt or truncated "
                             "protobuf") from None
    return model


def missing_external_data(tensor: str, location: str, folder: str) -> str | None:
    """Why the external data file ``location`` of ``tensor`` cannot be found in the model's
    ``folder``, naming the path the model expects and what to do; None when it is a file.
    External data is read relative to the model file's folder (onnx's rule), not the current
    directory, and qlinear reads it nowhere else."""
    folder = os.path.abspath(folder)
    expected = os.path.normpath(os.path.join(folder, location))
    if os.path.isfile(expected):
        return None
    parent = os.path.dirname(expected)
    what = (f"the folder {parent} does not exist" if not os.path.isdir(parent) else
            "it is not a regular file" if os.path.exists(expected) else "no such file")
    return (f"tensor {tensor!r} keeps its data in the external file {location!r}, expected at {expected}, "
            f"but {what}; external data is read from the model's folder ({folder}) whatever the "
            f"current directory: put the file there, or keep the model next to its data")


def _external_int(t: onnx.TensorProto, info: dict[str, str], key: str, default: int) -> int:
    """An external-data field that must be a non-negative whole number of bytes."""
    text = info.get(key, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelFileError(f"tensor {t.name!r}: external data {key} {text[:40]!r} is not a "
                             "non-negative whole number of bytes")
    return value


def _declared_nbytes(t: onnx.TensorProto) -> int | None:
    """Bytes the tensor's dims and element type take (4-bit types packed), None for strings
    or an element type onnx does not define (then the length given is taken as it is)."""
    try:
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
    except Exception:  # KeyError for numbers onnx does not define
        return None
    if dtype.kind in "OSU":
        return None
    n = 1
    for d in t.dims:
        n *= max(int(d), 0)
    four_bit = {getattr(onnx.TensorProto, k) for k in ("INT4", "UINT4", "FLOAT4E2M1")
                if hasattr(onnx.TensorProto, k)}
    return (n + 1) // 2 if t.data_type in four_bit else n * dtype.itemsize


def _length(t: onnx.TensorProto, info: dict[str, str], need: int | None, size: int,
            offset: int) -> int:
    """The bytes to read: the length given (0 or absent: the declared size, or the rest of
    the file for strings)."""
    length = _external_int(t, info, "length", 0)
    if length == 0:
        length = need if need is not None else max(size - offset, 0)
    return length


def _external_path(t: onnx.TensorProto, folder: str) -> tuple[str, str, dict[str, str]]:
    """(location, confined real path, external_data fields) of an external tensor; refused
    when the location leaves the model's folder in any way."""
    info = {e.key: e.value for e in t.external_data}
    loc = info.get("location", "")
    if not loc:
        raise ModelFileError(f"tensor {t.name!r}: external data without a location")
    outside = ModelFileError(f"tensor {t.name!r}: external data path {loc!r} points outside "
                             "the model's folder")
    if "\0" in loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or \
            ".." in loc.replace("\\", "/").split("/"):
        raise outside
    base = os.path.realpath(folder)
    named = os.path.join(base, loc)
    path = os.path.realpath(named)  # links resolved: they must stay inside
    if os.path.commonpath([base, path]) != base:
        raise outside
    if os.path.islink(named):  # as onnx's own loader: the data file itself is never a link
        raise ModelFileError(f"tensor {t.name!r}: external data file {loc!r} is a symbolic "
                             "link; external data must be a file in the model's folder")
    return loc, path, info


def check_external_data(model: onnx.ModelProto, folder: str,
                        max_tensor_bytes: int | None = None) -> None:
    """Every external tensor's location confined to ``folder``, a regular file there, its
    offset and length whole numbers inside it, its declared size no larger than
    ``max_tensor_bytes`` (when given); ModelFileError naming the tensor otherwise. Nothing
    is read."""
    for t in model_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc, path, info = _external_path(t, folder)
        need = _declared_nbytes(t)
        if max_tensor_bytes is not None and need is not None and need > max_tensor_bytes:
            raise ModelFileError(f"tensor {t.name!r} declares {human(need)}, more than the limit "
                                 f"of {human(max_tensor_bytes)} (max_tensor_bytes, qlinear's "
                                 "--max-tensor-bytes)")
        if not os.path.isfile(path):
            raise ModelFileError(missing_external_data(t.name, loc, folder)
                                 or f"tensor {t.name!r}: external data file {loc!r} is not a "
                                    "regular file")
        offset = _external_int(t, info, "offset", 0)
        size = os.path.getsize(path)
        length = _length(t, info, need, size, offset)
        if need is not None and length != need:
            raise ModelFileError(f"tensor {t.name!r}: external data length {length} does not "
                                 f"match the {need} bytes its shape {list(t.dims)} and type take")
        if offset + length > size:
            raise ModelFileError(f"tensor {t.name!r}: external data file {loc!r} is shorter than "
                                 "the tensor it should hold (truncated?)")


def load_external_data(model: onnx.ModelProto, folder: str,
                       max_tensor_bytes: int | None = None) -> None:
    """Read every external tensor's bytes into the model (as raw_data), after
    :func:`check_external_data`; each file opened through the same guarded open as the model
    (a file swapped for a FIFO or device after the check is refused, not read)."""
    check_external_data(model, folder, max_tensor_bytes)
    for t in model_tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        loc, path, info = _external_path(t, folder)
        need = _declared_nbytes(t)
        offset = _external_int(t, info, "offset", 0)
        f, size = open_regular(path, f"tensor {t.name!r}: external data file {loc!r}",
                                nofollow=True)
        with f:
            length = _length(t, info, need, size, offset)
            if offset + length > size:
                raise ModelFileError(f"tensor {t.name!r}: external data file {loc!r} is shorter "
                                     "than the tensor it should hold (truncated?)")
            try:
                f.seek(offset)
                data = f.read(length)
            except OSError as e:
                raise ModelFileError(f"tensor {t.name!r}: external data file {loc!r}: cannot read "
                                     f"it ({e.strerror or e})") from None
        if len(data) != length:
            raise ModelFileError(f"tensor {t.name!r}: external data file {loc!r} is shorter "
                                 "than the tensor it should hold (truncated?)")
        t.raw_data = data
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT


def densify_sparse_initializers(model: onnx.ModelProto, where: str, max_bytes: int | None = None,
                                limit_name: str = "max_tensor_bytes") -> None:
    """Replace every ``sparse_initializer`` by the dense initializer it stands for (onnx's
    reference evaluator reads dense initializers only, and fails on a sparse one with
    protobuf's 'SparseTensorProto has no "data_location" field'). Shapes and indices are
    checked first: the dense size against ``max_bytes`` (when given), every index inside the
    shape; ModelFileError naming the initializer otherwise. External data must have been read
    (:func:`load_external_data`): onnx's ``to_array`` would read it relative to the current
    directory."""
    for g in _graphs(model.graph):
        if not len(g.sparse_initializer):
            continue
        dense = []
        for sp in g.sparse_initializer:
            name = sp.values.name
            what = f"{where}: sparse initializer {name!r}"
            dims = [int(d) for d in sp.dims]
            if any(d < 0 for d in dims):
                raise ModelFileError(f"{what}: negative dimension in {dims}")
            probe = onnx.TensorProto(dims=dims, data_type=sp.values.data_type)
            need = _declared_nbytes(probe) or 0
            if max_bytes is not None and need > max_bytes:
                raise ModelFileError(f"tensor {name!r} declares {human(need)}, more than the limit "
                                     f"of {human(max_bytes)} ({limit_name})")
            if onnx.TensorProto.EXTERNAL in (sp.values.data_location, sp.indices.data_location):
                raise ModelFileError(f"{what}: its external data was not read (pass the model's "
                                     "path)")
            try:
                values = numpy_helper.to_array(sp.values)
                indices = numpy_helper.to_array(sp.indices) if sp.HasField("indices") else \
                    np.zeros((0,), np.int64)
            except Exception as e:
                raise ModelFileError(f"{what}: unreadable values or indices ({' '.join(str(e).split())[:300]})") from None
            nnz = values.size
            size = int(np.prod(dims, dtype=np.int64)) if dims else 1
            if values.ndim != 1:
                raise ModelFileError(f"{what}: values must be 1-D, got shape {list(values.shape)}")
            if indices.dtype != np.int64:
                raise ModelFileError(f"{what}: indices must be int64, got {indices.dtype}")
            if indices.shape == (nnz,):
                flat = indices
            elif indices.shape == (nnz, len(dims)):
                if nnz and ((indices < 0).any() or (indices >= np.array(dims)).any()):
                    raise ModelFileError(f"{what}: an index lies outside the shape {dims}")
                flat = np.ravel_multi_index(tuple(indices.T), dims) if nnz else \
                    np.zeros((0,), np.int64)
            else:
                raise ModelFileError(f"{what}: indices of shape {list(indices.shape)} do not match "
                                f"{nnz} values of a rank-{len(dims)} tensor")
            if nnz and ((flat < 0).any() or (flat >= size).any()):
                raise ModelFileError(f"{what}: an index lies outside the {size} elements of shape "
                                f"{dims}")
            arr = np.zeros(dims, dtype=values.dtype)
            arr.reshape(-1)[flat] = values
            t = numpy_helper.from_array(arr, name)
            t.data_type = sp.values.data_type  # keep e.g. bfloat16 as declared
            dense.append(t)
        g.initializer.extend(dense)
        g.ClearField("sparse_initializer")


def check_loaded(model: onnx.ModelProto, from_bytes: bool) -> None:
    """ModelFileError naming a tensor whose data lives in an external file that was not read
    (``onnx.load(path, load_external_data=False)``, or a model's bytes, which cannot name the
    folder): onnx.reference failed on it with 'An instance of LargeContainer should be created
    before using ReferenceEvaluator', which says neither what nor how to fix it."""
    for t in model_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "?")
            how = ("a model given as bytes cannot read it: pass the model's path" if from_bytes else
                   "pass the model's path, or load it with onnx.load(path) (which reads external data) or "
                   "onnx.external_data_helper.load_external_data_for_model(model, folder)")
            raise ModelFileError(f"tensor {t.name!r} keeps its data in the external file "
                                 f"{location!r}, which was not loaded; {how}")


def _known_elem_type(elem: int) -> bool:
    try:
        helper.tensor_dtype_to_np_dtype(elem)
    except Exception:  # KeyError for numbers onnx does not define
        return False
    return True


_A = onnx.AttributeProto
#: The field that holds an attribute's value, by its declared type.
_ATTR_FIELD = {_A.FLOAT: "f", _A.INT: "i", _A.STRING: "s", _A.TENSOR: "t", _A.GRAPH: "g",
               _A.SPARSE_TENSOR: "sparse_tensor", _A.TYPE_PROTO: "tp", _A.FLOATS: "floats",
               _A.INTS: "ints", _A.STRINGS: "strings", _A.TENSORS: "tensors",
               _A.GRAPHS: "graphs", _A.SPARSE_TENSORS: "sparse_tensors",
               _A.TYPE_PROTOS: "type_protos"}
_SCALAR_FIELDS = frozenset("f i s t g sparse_tensor tp".split())


def _value_fields(a: onnx.AttributeProto) -> list[str]:
    """The value fields an attribute has set."""
    return [f for f in _ATTR_FIELD.values()
            if (a.HasField(f) if f in _SCALAR_FIELDS else len(getattr(a, f)))]


#: INT attributes that hold an element type (Cast's ``to``, RandomNormal's ``dtype``, ...).
_ELEM_TYPE_ATTRS = ("to", "dtype", "output_dtype")


def check_contents(model: onnx.ModelProto, where: str) -> None:
    """ModelFileError naming the place (``where``: the file, or "prepare"'s model) of the
    first value onnx or NumPy would otherwise fail on with a bare KeyError or
    UnicodeDecodeError, far from its cause: an element type ONNX does not define (an
    initializer's, a sparse initializer's or sparse tensor attribute's values or indices, a
    tensor attribute's, graph input's, output's or
    value_info's, an element-type attribute such as Cast's ``to``), an attribute whose type
    field is unset, a string that is not UTF-8. Graphs, subgraphs and model-local functions
    are all walked."""
    def bad_type(what: str, elem: int) -> ModelFileError:
        return ModelFileError(f"{where}: {what} has element type {elem}, which is not an ONNX "
                              "element type (invalid or corrupt model)")

    bad = _first_non_utf8_field(model, "model")
    if bad:
        place, value = bad
        raise ModelFileError(f"{where}: {place} is not valid UTF-8 text ({value[:20]!r}); "
                             "corrupt model?")
    graphs = [g for g in _graphs(model.graph)]
    node_lists = [(g.node, "") for g in graphs]
    for fn in model.functions:
        node_lists.append((fn.node, f"function {fn.name!r}: "))
        for node in fn.node:
            for g in subgraphs(node):
                for sub in _graphs(g):
                    graphs.append(sub)
                    node_lists.append((sub.node, f"function {fn.name!r}: "))
    for g in graphs:
        for t in g.initializer:
            if not _known_elem_type(t.data_type):
                raise bad_type(f"initializer {t.name!r}", t.data_type)
        for sp in g.sparse_initializer:
            for part, t in (("values", sp.values), ("indices", sp.indices)):
                if not _known_elem_type(t.data_type):
                    raise bad_type(f"sparse initializer {sp.values.name!r} ({part})", t.data_type)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type"):
                elem = vi.type.tensor_type.elem_type
                if elem and not _known_elem_type(elem):
                    raise bad_type(f"tensor {vi.name!r}", elem)
    for t in graph_tensors(model.graph):
        if _known_elem_type(t.data_type):
            problem = tensor_data_problem(t)
            if problem:
                raise ModelFileError(f"{where}: {problem}")
    for nodes, prefix in node_lists:
        for i, node in enumerate(nodes):
            label = f"{prefix}node {node.name or f'#{i}'!r} ({node.op_type})"
            for a in node.attribute:
                if a.type == onnx.AttributeProto.UNDEFINED and not a.ref_attr_name:
                    raise ModelFileError(f"{where}: {label}: attribute {a.name!r} has no type "
                                         "(its type field is unset; invalid or corrupt model)")
                held = _value_fields(a) if not a.ref_attr_name else []
                if held and _ATTR_FIELD.get(a.type) not in held:
                    # onnx.reference reads the declared type's field (its default: alpha 0.0
                    # read as the INT 0), onnxruntime and onnx's checker refuse the model
                    raise ModelFileError(
                        f"{where}: {label}: attribute {a.name!r} is declared "
                        f"{onnx.AttributeProto.AttributeType.Name(a.type)} but holds a value in "
                        f"its field {held[0]!r} (type and value do not match; invalid or corrupt "
                        "model)")
                texts = [a.s] if a.type == onnx.AttributeProto.STRING else \
                    list(a.strings) if a.type == onnx.AttributeProto.STRINGS else []
                for text in texts:
                    try:
                        text.decode("utf-8")
                    except UnicodeDecodeError:
                        raise ModelFileError(f"{where}: {label}: attribute {a.name!r} is not "
                                             f"valid UTF-8 text ({text[:20]!r})") from None
                if a.type == onnx.AttributeProto.INT and a.name in _ELEM_TYPE_ATTRS \
                        and a.i and not _known_elem_type(a.i):
                    raise ModelFileError(f"{where}: {label}: attribute {a.name!r} = {a.i} is not "
                                         "an ONNX element type")
                tensors = [a.t] if a.type == onnx.AttributeProto.TENSOR else \
                    list(a.tensors) if a.type == onnx.AttributeProto.TENSORS else []
                for t in tensors:
                    if not _known_elem_type(t.data_type):
                        raise bad_type(f"{label} attribute {a.name!r}", t.data_type)
                sparse = [a.sparse_tensor] if a.type == onnx.AttributeProto.SPARSE_TENSOR else \
                    list(a.sparse_tensors) if a.type == onnx.AttributeProto.SPARSE_TENSORS else []
                for sp in sparse:
                    for part, t in (("values", sp.values), ("indices", sp.indices)):
                        if not _known_elem_type(t.data_type):
                            raise bad_type(f"{label} attribute {a.name!r} ({part})", t.data_type)


#: TensorProto fields that can hold the values, besides raw_data.
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")


def tensor_data_problem(t: onnx.TensorProto) -> str | None:
    """Why an embedded tensor's data does not fit its shape and type, or None: raw_data must
    hold exactly the bytes ONNX's layout takes (sub-byte types packed: 2-bit four to a byte,
    4-bit two, float6 ceil(6n/8)), a typed field one entry per element (per packed byte for
    2- and 4-bit types). onnx would otherwise fail far from the cause ('cannot reshape array
    of size ...'), or ignore extra bytes and answer."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    if any(d < 0 for d in t.dims):
        return f"tensor {t.name!r} has a negative dimension {list(t.dims)}"
    n = 1
    for d in t.dims:
        n *= int(d)
    try:
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
    except KeyError:
        return None  # an unknown element type: check_contents names it
    try:
        bits = dtypes.from_onnx(t.data_type).bits  # the registry: one home of packing widths
    except (KeyError, ValueError):
        bits = 8 * dtype.itemsize
    shown = f"tensor {t.name!r} of shape {list(t.dims)} ({dtype})"
    if t.raw_data:
        if dtype.kind in "OSU":
            return None
        want = (n * bits + 7) // 8
        if len(t.raw_data) != want:
            return f"{shown} holds {len(t.raw_data)} bytes of data, not {want} (corrupt or truncated?)"
        return None
    counts = [len(getattr(t, f)) for f in _TYPED_FIELDS if len(getattr(t, f))]
    have = counts[0] if counts else 0
    complex_ = t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128)
    per_entry = 8 // bits if bits in (2, 4) else 1  # int32_data holds packed bytes of these
    want = 2 * n if complex_ else (n + per_entry - 1) // per_entry
    if have != want:
        return f"{shown} holds {have} values, not {want} (corrupt or truncated?)"
    return None


def _first_non_utf8_field(msg, where: str):
    """(field path, value) of the first string field that is not valid UTF-8, or None.
    protobuf hands such a field back as bytes instead of str; onnx and the checker then fail
    with a bare UnicodeDecodeError. Walks every message of the model (tensor payloads are
    bytes fields, not visited)."""
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else \
            fd.label == F.LABEL_REPEATED  # protobuf < 5.26 has no is_repeated
        if fd.type == F.TYPE_STRING:
            for i, v in enumerate(value if repeated else [value]):
                if isinstance(v, bytes):
                    name = getattr(msg, "name", "") if fd.name != "name" else ""
                    label = f" {name!r}" if isinstance(name, str) and name else ""
                    return f"{where}{label}: {fd.name}" + (f"[{i}]" if repeated else ""), v
        elif fd.type == F.TYPE_MESSAGE:
            for i, v in enumerate(value if repeated else [value]):
                found = _first_non_utf8_field(v, f"{where}.{fd.name}" + (f"[{i}]" if repeated
                                                                          else ""))
                if found:
                    return found
    return None


def load(path: str | os.PathLike, *, max_tensor_bytes: int | None = None,
         external_data: bool = True) -> onnx.ModelProto:
    """The model at ``path`` with its external data read from its folder (see the module's
    docstring); ModelFileError for anything that is not a readable ONNX model file. An empty
    file parses as a ModelProto without a graph (the caller says what it needs)."""
    path = os.fspath(path)
    model = parse(read_bytes(path), f"{path!r} is")
    if external_data:
        load_external_data(model, os.path.dirname(os.path.abspath(path)), max_tensor_bytes)
    return model
