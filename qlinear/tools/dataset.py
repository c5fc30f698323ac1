"""Datasets for ``qlinear compare --dataset``: read sample by sample, checked as they are read.

Two forms:

- a **folder of .npz files**, one sample each, arrays keyed by input name with the input's
  shape (symbolic dimensions any size); samples in the order of their file names. Every entry
  of the folder must be such a file (nothing is skipped silently);
- **one .npz** whose arrays carry a leading sample axis: ``(N, *input shape)``, or
  ``(N, *input shape without its first dimension)`` where the input's first dimension is 1 or
  symbolic (each sample is then a batch of one). Arrays stored uncompressed (``np.savez``) are
  read a sample at a time at its offset inside the zip (memory-mapped only for a Fortran-order
  array); compressed ones (``np.savez_compressed``) are decompressed as a stream; neither is
  ever loaded whole.

Every problem is one :class:`DatasetError` naming the file (and the array): a sample of the
wrong shape, a dtype that is not the model's (float64 for a float32 input is refused, as
onnxruntime refuses it), a missing input, an array that is no input, an empty folder, a corrupt
or truncated file, object arrays (never unpickled).
"""

from __future__ import annotations

import os
import struct
import zipfile
from typing import Any

import numpy as np

from qlinear.modelfile import ModelFileError, human
from qlinear.tools.arrayfile import ArrayFileError, load
from qlinear.tools.model import ToolError


class DatasetError(ToolError, ValueError):
    """A bad dataset or labels file: one line naming the file (a ValueError too, so the
    command prints its sentence alone, as a ToolError's)."""


#: name -> (numpy dtype or None, declared shape with None for symbolic dimensions, or None)
Declared = dict[str, tuple[Any, Any]]


def _fmt_shape(shape) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def check_sample(where: str, arrays: dict[str, np.ndarray], required: Declared,
                 optional: Declared) -> None:
    """DatasetError naming ``where`` unless ``arrays`` holds every required input, nothing that
    is no input, each of the declared dtype and shape."""
    known = {**required, **optional}
    for name in arrays:
        if name not in known:
            raise DatasetError(f"{where}: array {name!r} is not an input of the model (its inputs "
                               f"are {', '.join(map(repr, required)) or '(none)'})")
    for name in required:
        if name not in arrays:
            raise DatasetError(f"{where}: no array for input {name!r}")
    for name, arr in arrays.items():
        dtype, shape = known[name]
        if dtype is not None and arr.dtype != dtype:
            raise DatasetError(f"{where}: input {name!r} has dtype {arr.dtype}, the model declares "
                               f"{np.dtype(dtype)} (convert the data; it is not converted silently)")
        if shape is not None and (arr.ndim != len(shape) or any(
                d is not None and d != s for d, s in zip(shape, arr.shape))):
            raise DatasetError(f"{where}: input {name!r} has shape {list(arr.shape)}, the model "
                               f"declares {_fmt_shape(shape)}")


class FolderDataset:
    """A folder of .npz files, one sample each (file-name order)."""

    kind = "folder of .npz files, one sample each"

    def __init__(self, path: str, required: Declared, optional: Declared,
                 max_bytes: int | None = None) -> None:
        self.path, self.required, self.optional = path, required, optional
        self.max_bytes = max_bytes
        try:
            names = sorted(os.listdir(path))
        except OSError as e:
            raise DatasetError(f"--dataset {path}: cannot list the folder ({e.strerror})") from None
        if not names:
            raise DatasetError(f"--dataset {path}: the folder is empty (no .npz samples)")
        for n in names:
            full = os.path.join(path, n)
            if not n.endswith(".npz") or not os.path.isfile(full):
                what = "a folder" if os.path.isdir(full) else "not a .npz file"
                raise DatasetError(f"{full}: {what}; a dataset folder holds only .npz files, one "
                                   "sample each (nothing is skipped)")
        self.files = [os.path.join(path, n) for n in names]
        self.size = len(self.files)

    def sample(self, i: int) -> dict[str, np.ndarray]:
        file = self.files[i]
        try:
            # every member's header checked (its size against the limit and the bytes the
            # file holds) before NumPy allocates anything: qlinear.tools.arrayfile
            arrays = load(file, file, self.max_bytes)
        except (ArrayFileError, ModelFileError) as e:
            raise DatasetError(str(e)) from None
        if not isinstance(arrays, dict):
            raise DatasetError(f"{file}: a .npy array; a dataset sample is a .npz of arrays named "
                               "by input")
        check_sample(file, arrays, self.required, self.optional)
        return arrays

    def close(self) -> None:
        pass


class _Member:
    """One array of a .npz, read sample by sample along its first axis."""

    def __init__(self, npz: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str,
                 max_bytes: int | None = None) -> None:
        self.where = f"{npz} (array {name!r})"
        self.npz, self.zf, self.info = npz, zf, info
        with zf.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            header = f.tell()
            header_len = header if info.compress_type == zipfile.ZIP_STORED else None
        if dtype.hasobject:
            raise DatasetError(f"{self.where}: an object array (pickled data is never loaded)")
        if not shape:
            raise DatasetError(f"{self.where}: a scalar; the arrays of a single-file dataset carry "
                               "a leading sample axis")
        self.shape, self.dtype, self.fortran = tuple(shape), dtype, fortran
        row = dtype.itemsize
        for d in shape[1:]:
            row *= int(d)
        self.row_bytes = row
        # sizes from the header, checked before anything is allocated: a sample above the
        # limit, or an array larger than the bytes the member holds (its size in the zip's
        # directory), is refused
        if max_bytes is not None and row > max_bytes:
            raise DatasetError(f"{self.where}: one sample declares {human(row)}, more than the "
                               f"limit of {human(max_bytes)} (--max-tensor-bytes)")
        if row * int(shape[0]) > info.file_size - header:
            raise DatasetError(f"{self.where}: declares {human(row * int(shape[0]))} but holds "
                               f"{human(max(info.file_size - header, 0))} (truncated or corrupt?)")
        self.mapped = None
        self.file = None  # stored in C order: positioned reads of one sample
        self.start = 0
        self.stream = None
        self.pos = 0
        if header_len is not None:  # stored: memory-map the array's bytes inside the zip
            with open(npz, "rb") as raw:
                raw.seek(info.header_offset)
                local = raw.read(30)
                if len(local) != 30 or local[:4] != b"PK\x03\x04":
                    raise DatasetError(f"{self.where}: corrupt .npz (bad local header)")
                n, m = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + n + m + header_len
            need = self.row_bytes * shape[0]
            if start + need > os.path.getsize(npz):
                raise DatasetError(f"{self.where}: truncated (the file ends before the array's "
                                   f"{need} bytes)")
            if fortran and len(shape) > 1:  # a sample's elements are strided: map the array
                self.mapped = np.memmap(npz, dtype=dtype, mode="r", offset=start,
                                        shape=self.shape, order="F")
            else:
                # a sample's bytes are contiguous: read them with one positioned read (a
                # memory map would leave every page read resident in the process, so its
                # memory would grow to the file's size over a run, though reclaimable)
                self.start = start
                self.file = open(npz, "rb")
        elif fortran and len(shape) > 1:
            raise DatasetError(f"{self.where}: compressed and in Fortran order, so it cannot be "
                               "read sample by sample; save it in C order or with np.savez")

    def row(self, i: int) -> np.ndarray:
        if self.file is not None:
            buf = bytearray(self.row_bytes)
            self.file.seek(self.start + i * self.row_bytes)
            if self.file.readinto(buf) != self.row_bytes:
                raise DatasetError(f"{self.where}: truncated (the array ends early)")
            return np.frombuffer(buf, dtype=self.dtype).reshape(self.shape[1:])
        if self.mapped is not None:
            return np.array(self.mapped[i])  # a copy: the map stays read-only
        if self.stream is None or i < self.pos:
            if self.stream is not None:
                self.stream.close()
            self.stream = self.zf.open(self.info)
            if np.lib.format.read_magic(self.stream) == (1, 0):
                np.lib.format.read_array_header_1_0(self.stream)
            else:
                np.lib.format.read_array_header_2_0(self.stream)
            self.pos = 0
        if i > self.pos:
            self._skip((i - self.pos) * self.row_bytes)
            self.pos = i
        data = self._read(self.row_bytes)
        self.pos = i + 1
        return np.frombuffer(data, dtype=self.dtype).reshape(self.shape[1:]).copy()

    def _read(self, n: int) -> bytes:
        try:
            data = self.stream.read(n)
        except Exception as e:  # zlib.error, BadZipFile (CRC), EOFError
            raise DatasetError(f"{self.where}: corrupt or truncated ({type(e).__name__}: {e})") from None
        if len(data) != n:
            raise DatasetError(f"{self.where}: truncated (the array ends early)")
        return data

    def _skip(self, n: int) -> None:
        while n:
            chunk = min(n, 1 << 24)
            self._read(chunk)
            n -= chunk

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        if self.file is not None:
            self.file.close()
        self.mapped = None


class NpzDataset:
    """One .npz whose arrays carry a leading sample axis."""

    kind = "one .npz, samples along the first axis"

    def __init__(self, path: str, required: Declared, optional: Declared,
                 max_bytes: int | None = None) -> None:
        self.path, self.required, self.optional = path, required, optional
        try:
            self.zf = zipfile.ZipFile(path)
            infos = {i.filename: i for i in self.zf.infolist()}
        except Exception as e:  # BadZipFile, OSError
            raise DatasetError(f"{path}: not a readable .npz file (corrupt or truncated? "
                               f"{type(e).__name__}: {e})") from None
        if not infos:
            raise DatasetError(f"{path}: an empty .npz (no arrays)")
        self.members: dict[str, _Member] = {}
        try:
            for fname, info in infos.items():
                if not fname.endswith(".npy"):
                    raise DatasetError(f"{path}: member {fname!r} is not a .npy array (not a NumPy "
                                       ".npz file?)")
                name = fname[:-4]
                self.members[name] = _Member(path, self.zf, info, name, max_bytes)
        except DatasetError:
            raise
        except Exception as e:
            raise DatasetError(f"{path}: not a readable .npz file (corrupt or truncated? "
                               f"{type(e).__name__}: {e})") from None
        known = {**required, **optional}
        sizes = set()
        self.batch_of_one: dict[str, bool] = {}
        for name, m in self.members.items():
            where = m.where
            if name not in known:
                raise DatasetError(f"{where}: not an input of the model (its inputs are "
                                   f"{', '.join(map(repr, required)) or '(none)'})")
            dtype, shape = known[name]
            if dtype is not None and m.dtype != dtype:
                raise DatasetError(f"{where}: dtype {m.dtype}, the model declares {np.dtype(dtype)} "
                                   "for that input (convert the data; it is not converted silently)")
            row = list(m.shape[1:])
            one = False
            if shape is not None:
                fits = len(row) == len(shape) and all(d is None or d == s for d, s in zip(shape, row))
                one = (not fits and len(row) + 1 == len(shape) and shape[0] in (None, 1)
                       and all(d is None or d == s for d, s in zip(shape[1:], row)))
                if not fits and not one:
                    raise DatasetError(
                        f"{where}: shape {list(m.shape)}; the model declares {_fmt_shape(shape)} "
                        f"for that input, so the array must be (samples, *{_fmt_shape(shape)})"
                        + (f" or (samples, *{_fmt_shape(shape[1:])})" if shape and shape[0] in (None, 1)
                           else ""))
            self.batch_of_one[name] = one
            sizes.add(m.shape[0])
        for name in required:
            if name not in self.members:
                raise DatasetError(f"{path}: no array for input {name!r}")
        if len(sizes) > 1:
            raise DatasetError(f"{path}: the arrays have different numbers of samples "
                               f"({', '.join(f'{n!r}: {m.shape[0]}' for n, m in self.members.items())})")
        self.size = sizes.pop()
        if self.size == 0:
            raise DatasetError(f"{path}: no samples (the arrays' first axis is 0)")

    def sample(self, i: int) -> dict[str, np.ndarray]:
        out = {}
        for name, m in self.members.items():
            row = m.row(i)
            out[name] = row[None] if self.batch_of_one[name] else row
        return out

    def close(self) -> None:
        for m in self.members.values():
            m.close()
        self.zf.close()


def open_dataset(path: str, required: Declared, optional: Declared | None = None,
                 max_bytes: int | None = None):
    """The dataset at ``path`` (a folder of .npz files or one .npz), checked as far as can be
    without reading the samples: folder entries; a single file's array headers. ``max_bytes``
    (``--max-tensor-bytes``) bounds one sample of one array, checked on its header."""
    optional = optional or {}
    if not os.path.exists(path):
        raise DatasetError(f"--dataset {path}: no such file or folder")
    if os.path.isdir(path):
        ds = FolderDataset(path, required, optional, max_bytes)
        ds.sample(0)  # most mistakes show in the first sample: said before anything runs
        return ds
    if not os.path.isfile(path):
        raise DatasetError(f"--dataset {path}: not a regular file or folder (a pipe or device)")
    return NpzDataset(path, required, optional, max_bytes)


def load_labels(path: str, samples: int) -> np.ndarray:
    """``--labels FILE.npy``: one integer class per sample (memory-mapped)."""
    if not os.path.isfile(path):
        raise DatasetError(f"--labels {path}: no such file" if not os.path.exists(path)
                           else f"--labels {path}: not a regular file")
    try:
        labels = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise DatasetError(f"--labels {path}: not a readable .npy file ({type(e).__name__}: {e})") from None
    if not isinstance(labels, np.ndarray):
        raise DatasetError(f"--labels {path}: not a .npy array (a .npz?); save one 1-D integer array")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DatasetError(f"--labels {path}: must be a 1-D integer array (one class per sample); "
                           f"got {labels.dtype}{list(labels.shape)}")
    if labels.shape[0] != samples:
        raise DatasetError(f"--labels {path}: {labels.shape[0]} labels for {samples} samples")
    return labels
