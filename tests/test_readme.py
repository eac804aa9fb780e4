"""The README is a front page that stays true: under 150 lines, its Python example is `examples/quickstart.py`
word for word, and that example runs (with the tiny policy and one step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    assert text.splitlines()[9:11] == [
        "bash scripts/demo.sh     # set up .venv and run `agentrft demo` on embedded defaults",
        "bash scripts/test.sh     # set up .venv and run the whole test suite (real-model tests included)",
    ]  # the two commands CI and a new user run first


@pytest.mark.slow
def test_the_python_example_is_the_quickstart_file_and_runs(tmp_path: Path) -> None:
    example = (ROOT / "examples" / "quickstart.py").read_text()
    code = example.split('"""\n\n', 1)[1]  # the file without its docstring
    assert f"```python\n{code}```" in (ROOT / "README.md").read_text()
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "tiny", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after 1 steps" in done.stdout and (tmp_path / "runs" / "api" / "policy").is_dir()
