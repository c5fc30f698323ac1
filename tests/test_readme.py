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
