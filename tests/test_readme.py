"""The README's operator examples run, and print what their comments say."""

import builtins
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_examples_print_what_they_claim():
    blocks = _python_blocks()
    assert blocks, "README has no python example"
    for block in blocks:
        expected = []
        for line in block.splitlines():
            m = re.match(r"\s*print\(.*\)\s+# (.*)$", line)
            if m:
                # A "(...)" after two spaces in the comment is an explanation, not output.
                expected.append(re.sub(r"\s{2,}\(.*\)$", "", m.group(1)).strip())
        printed = []

        def record(*args, **kwargs):
            printed.append(" ".join(str(a) for a in args))

        exec(compile(block, str(README), "exec"), {"print": record, "__builtins__": builtins})
        assert len(printed) == len(expected)
        for got, want in zip(printed, expected):
            assert " ".join(got.split()) == " ".join(want.split())


def test_readme_synopses_name_every_flag():
    """Every option of every `qlinear` subcommand appears in the README's synopsis of that
    subcommand (the paragraph starting with `qlinear NAME`)."""
    import argparse

    import pytest

    pytest.importorskip("onnx")
    from qlinear import cli

    text = README.read_text()
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in subs.choices.items():
        # the README's bullet for this command: from "`qlinear NAME" to the next command's
        # bullet or the next blank line
        m = re.search(rf"`qlinear {name}\b.*?(?=\n- `qlinear |\n\n|\Z)", text, flags=re.S)
        assert m, f"README has no synopsis of `qlinear {name}`"
        for action in sub._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help" and opt not in m.group(0):
                    missing.append(f"{name} {opt}")
    assert not missing, missing
