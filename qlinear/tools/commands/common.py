"""What the ``qlinear`` commands share: their one-line errors, strict JSON, output summaries,
the bundled example's paths. Needs no onnx: the parser (``qlinear --help``) uses it too."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "examples")
EXAMPLE_META = os.path.join(EXAMPLES_DIR, "digits_meta.json")


class CommandError(Exception):
    """A command's bad input or failure: one line ``qlinear: error: ...``, exit status 2."""


def json_safe(v: Any) -> Any:
    """``v`` with every non-finite float as the string "inf", "-inf" or "nan": JSON has no such
    numbers, and json.dumps would write Infinity / NaN, which strict parsers (jq, JavaScript's
    JSON.parse) refuse."""
    if isinstance(v, float) and not np.isfinite(v):
        return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def dumps(result: Any) -> str:
    """The --json text of a command's result: strict JSON."""
    return json.dumps(json_safe(result), indent=2, allow_nan=False)


def _fmt_num(v: float) -> str:
    return f"{v:.6g}"


def summarize(arr: np.ndarray) -> str:
    a = np.asarray(arr)
    if a.size == 0:
        return "empty"
    if a.dtype == np.bool_:
        return f"{int(a.sum())} true of {a.size}"
    if np.issubdtype(a.dtype, np.integer):
        return f"min {a.min()}  max {a.max()}  mean {_fmt_num(float(a.mean()))}"
    if np.issubdtype(a.dtype, np.floating):
        finite = a[np.isfinite(a)]
        s = (f"min {_fmt_num(float(finite.min()))}  max {_fmt_num(float(finite.max()))}  "
             f"mean {_fmt_num(float(finite.mean()))}") if finite.size else "no finite values"
        nonfinite = a.size - finite.size
        return s + (f"  ({nonfinite} non-finite)" if nonfinite else "")
    return f"dtype {a.dtype}"


def qdq_options(args) -> dict[str, str] | None:
    """--qdq-accuracy as the onnxruntime session option both runtimes get (None: the default)."""
    level = getattr(args, "qdq_accuracy", None)
    return None if level is None else {"session.qdq_matmulnbits_accuracy_level": str(level)}


def progress_enabled(args) -> bool | None:
    return False if getattr(args, "json", False) else None
