"""The README's ten-line example runs as printed (the real model, greedy prompt lookup equal to AR)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_the_readme_example_runs_as_printed(capsys):
    code = re.search(r"## Ten lines\n\n```python\n(.*?)```", README.read_text(), flags=re.S).group(1)
    assert len(code.splitlines()) <= 12
    exec(compile(code, "README.md", "exec"), {})  # its assert: greedy speculation gives AR's tokens
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and float(printed[1]) > 0
