"""The one way the command-line tools write a file: guarded and atomic.

Every file a command writes (``qlinear run --output-dir`` and ``--save-inputs``,
``qlinear compare --save-inputs``, ``qlinear bench --output-dir``) goes through
:func:`write_file`:

- the target must not be a symbolic link, a folder, a FIFO, a device or a socket; an
  existing regular file is replaced, never written through (a hard link to a file elsewhere
  stays as it was, as does whatever a symbolic link points to);
- the bytes go to a new temporary file in the same folder, created with ``O_CREAT|O_EXCL``
  (``tempfile.mkstemp``: it never opens an existing name, so never follows a link planted
  there), and ``os.replace`` then renames it over the target: a rename replaces the directory
  entry itself and does not follow a link that appeared there since the check; a reader sees
  the old file or the whole new one, never half of it;
- any failure removes the temporary file and is one :class:`OutputError` naming the flag,
  the folder, the file and the reason.

Folders are made by :func:`output_dir`: an empty name is refused (it meant the current
folder), only the last folder of the normalized path is created.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import IO, Callable


class OutputError(ValueError):
    """A file or folder the command was asked to write cannot be written safely: the command
    prints ``qlinear: error: <message>`` and exits with 2."""


def output_dir(out_dir: str, flag: str, *, parents: bool = False) -> str:
    """The normalized folder ``out_dir`` (``a/../b`` is ``b``), created if missing: only the
    last folder, inside an existing parent (all missing folders with ``parents=True``, as
    ``qlinear bench`` has always made them). An empty name is refused: it was taken as the
    current folder."""
    if not str(out_dir).strip():
        raise OutputError(f"{flag} {out_dir!r}: an empty folder name (for the current folder "
                          f"say {flag} .)")
    folder = os.path.normpath(out_dir)
    if os.path.isdir(folder):
        return folder
    if os.path.lexists(folder):
        raise OutputError(f"{flag} {out_dir}: exists and is not a directory")
    parent = os.path.dirname(folder) or "."
    if not parents and not os.path.isdir(parent):
        raise OutputError(f"{flag} {out_dir}: the folder {parent} does not exist (only the "
                          "last folder is created)")
    try:
        if parents:
            os.makedirs(folder, exist_ok=True)
        else:
            os.mkdir(folder)
    except OSError as e:
        raise OutputError(f"{flag} {out_dir}: cannot create it ({e.strerror or e})") from None
    return folder


def check_target(flag: str, out_dir: str, path: str) -> None:
    """OutputError unless ``path`` is absent or an existing regular file (not a symbolic
    link, even one pointing to a regular file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputError(f"{flag} {out_dir}: cannot write {path} ({e.strerror or e})") from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"{flag} {out_dir}: refusing to write {path}: it is a symbolic link "
                          "(remove it, or choose another folder)")
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{flag} {out_dir}: cannot write {path} (Is a directory)")
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{flag} {out_dir}: refusing to write {path}: it is not a regular "
                          "file (a pipe, socket or device)")


def _umask() -> int:
    """The process's umask (read by setting it and back: the commands are single-threaded
    while they write)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(flag: str, out_dir: str, path: str, write: Callable[[IO[bytes]], object]) -> None:
    """``write(f)`` into a new temporary file next to ``path``, then renamed over ``path``
    (see the module's docstring); ``f`` is a binary file object. The file gets the mode a new
    file would get (0666 less the umask)."""
    check_target(flag, out_dir, path)
    folder = os.path.dirname(path) or "."
    name = os.path.basename(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".part")
    except OSError as e:
        raise OutputError(f"{flag} {out_dir}: cannot write {path} ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        check_target(flag, out_dir, path)  # said clearly if a link appeared meanwhile
        os.replace(tmp, path)  # replaces the entry: never follows a link planted since
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OutputError(f"{flag} {out_dir}: cannot write {path} "
                              f"({e.strerror or e})") from None
        raise
