"""Aligned text tables and progress bars for the terminal."""

from __future__ import annotations

import sys
from typing import Any, Iterable, Sequence


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
                 right: Iterable[str] = ()) -> str:
    """``columns`` = [(key, header)]; numbers and keys in ``right`` are right-aligned."""
    right = set(right)
    cells = [[("" if r.get(k) is None else str(r.get(k))) for k, _ in columns] for r in rows]
    heads = [h for _, h in columns]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]

    def line(vals):
        out = []
        for i, (v, (k, _)) in enumerate(zip(vals, columns)):
            last = i == len(columns) - 1
            if k in right:
                out.append(v.rjust(widths[i]))
            else:
                out.append(v if last else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(heads), sep] + [line(c) for c in cells])


def progress(iterable, *, total: int | None = None, desc: str = "", enabled: bool | None = None):
    """A tqdm bar on stderr when stderr is a terminal; the plain iterable otherwise."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def node_progress(enabled: bool | None = None):
    """The ``progress`` argument of ``QLinearRep.run`` / ``run_all``: a "qlinear" bar over the
    graph's nodes (see :func:`progress`; ``enabled=None``: when stderr is a terminal), or None
    when ``enabled`` is False."""
    if enabled is False:
        return None
    return lambda nodes: progress(nodes, total=len(nodes), desc="qlinear", enabled=enabled)
