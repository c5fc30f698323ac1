"""Reading ``--input`` array files (.npy, .npz) with every size checked before allocating.

NumPy allocates the whole array a .npy header declares before reading its data: a file of a
few bytes declaring 40 GiB is a 40 GiB allocation, and in an .npz every member is such a
header. Here each header (the .npy's, or every member's of an .npz) is read first and its
declared size checked against the limit (``--max-tensor-bytes``) and against the bytes the
file (or member) actually holds, and only then does NumPy load it, from the same open file
(a regular file, opened as model files are: :func:`qlinear.modelfile.open_regular`).
Pickled object arrays are never loaded.
"""

from __future__ import annotations

import zipfile
from typing import IO

import numpy as np

from qlinear.modelfile import human, open_regular


#: Most arrays an .npz may hold: reading each member's header costs about a millisecond, and
#: a model has at most a few hundred inputs (a large language model's caches: two per layer).
MAX_NPZ_MEMBERS = 4096


class ArrayFileError(ValueError):
    """An input file that is not a NumPy .npy/.npz file, or declares too much."""


def _declared(f: IO[bytes], what: str) -> tuple[int, int]:
    """(bytes the array declares, bytes of the header) of the .npy at ``f``'s position."""
    fmt = np.lib.format
    start = f.tell()
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ValueError(version)
    except Exception:
        raise ArrayFileError(f"{what}: not a NumPy .npy/.npz file") from None
    if dtype.hasobject:
        raise ArrayFileError(f"{what}: holds Python objects (a pickled object array), which are "
                             "never loaded; save a numeric array")
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize, f.tell() - start


def _check(what: str, need: int, have: int, max_bytes: int | None) -> None:
    if max_bytes is not None and need > max_bytes:
        raise ArrayFileError(f"{what}: declares an array of {human(need)}, more than the limit "
                             f"of {human(max_bytes)} (--max-tensor-bytes); nothing was loaded")
    if need > have:
        raise ArrayFileError(f"{what}: declares an array of {human(need)} but holds "
                             f"{human(have)} of data (truncated or corrupt?)")


def load(file: str, what: str, max_bytes: int | None) -> np.ndarray | dict[str, np.ndarray]:
    """The array of a .npy, or every array of an .npz by name; ArrayFileError (or the
    loader's ModelFileError for a missing or non-regular file) naming ``what`` otherwise."""
    try:
        return _load(file, what, max_bytes)
    except OSError as e:  # a "regular" file that fails to read: /proc/self/mem's EIO
        raise ArrayFileError(f"{what}: cannot read it ({e.strerror or e})") from None


def _load(file: str, what: str, max_bytes: int | None) -> np.ndarray | dict[str, np.ndarray]:
    """The array of a .npy, or every array of an .npz by name; ArrayFileError (or the
    loader's ModelFileError for a missing or non-regular file) naming ``what`` otherwise."""
    f, size = open_regular(file, what)
    with f:
        magic = f.read(6)
        f.seek(0)
        if magic == b"\x93NUMPY":
            need, header = _declared(f, what)
            _check(what, need, size - header, max_bytes)
            f.seek(0)
            try:
                return np.load(f, allow_pickle=False)
            except Exception:
                raise ArrayFileError(f"{what}: not a NumPy .npy/.npz file") from None
        if not magic.startswith(b"PK"):
            raise ArrayFileError(f"{what}: not a NumPy .npy/.npz file")
        try:
            zf = zipfile.ZipFile(f)
            infos = zf.infolist()
        except Exception:
            raise ArrayFileError(f"{what}: not a NumPy .npy/.npz file") from None
        with zf:
            if len(infos) > MAX_NPZ_MEMBERS:
                raise ArrayFileError(f"{what}: holds {len(infos):,} arrays, more than the "
                                     f"{MAX_NPZ_MEMBERS:,} an input file may hold "
                                     "(qlinear.tools.arrayfile.MAX_NPZ_MEMBERS); nothing was "
                                     "loaded")
            arrays: dict[str, np.ndarray] = {}
            names = [i.filename[:-4] if i.filename.endswith(".npy") else i.filename for i in infos]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:  # NumPy (and a dict) would keep one of them, silently
                raise ArrayFileError(f"{what}: holds the array {twice[0]!r} more than once "
                                     "(a corrupt or tampered .npz); which one is meant?")
            for info in infos:
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                member = f"{what} (array {name!r})"
                try:
                    with zf.open(info) as m:
                        need, header = _declared(m, member)
                except ArrayFileError:
                    raise
                except Exception:
                    raise ArrayFileError(f"{member}: unreadable (corrupt .npz?)") from None
                _check(member, need, info.file_size - header, max_bytes)
            for info in infos:
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                try:
                    with zf.open(info) as m:
                        arrays[name] = np.lib.format.read_array(m, allow_pickle=False)
                except Exception:
                    raise ArrayFileError(f"{what} (array {name!r}): unreadable (corrupt "
                                         ".npz?)") from None
            return arrays
