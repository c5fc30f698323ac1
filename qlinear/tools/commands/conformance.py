"""``qlinear conformance``: ONNX's backend node tests for the operators."""

from __future__ import annotations

from qlinear.tools.commands.common import dumps, progress_enabled
from qlinear.tools.conformance import format_report, run_conformance


def main(args) -> int:
    """``qlinear conformance``."""
    result = run_conformance(show_progress=progress_enabled(args))
    if args.json:
        print(dumps(result))
    else:
        print(format_report(result))
    return 0 if result["counts"]["FAIL"] == 0 else 1
