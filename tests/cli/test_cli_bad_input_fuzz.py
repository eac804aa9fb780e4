"""Fuzz the CLI's file inputs (the seeded corpus of `bad_input_corpus.py`): no traceback, ever.

For `grade` (grader spec JSON and YAML, items, samples), `traj import` (trajectory JSONL and chat
logs), `train` (YAML and TOML config), `eval --env jsonl:…`, `finqa evaluate` and `dpo --pairs`: empty, binary,
UTF-16, Latin-1, NUL bytes, lone surrogates, deep nesting (closed and unclosed), NaN/Infinity,
numbers too large, a YAML alias bomb, wrong types at seeded random places, and targeted shapes.

Every refused input exits 2 with exactly one line on stderr and writes nothing (no run dir, the
store unchanged, no eval store). A seeded wrong-type mutation may also be accepted (exit 0, or it
reaches the model loader, which is stubbed so that nothing heavy loads), never anything else.
`benchmarks/bad_input_tracebacks.py` runs the same corpus and counts tracebacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bad_input_corpus import Case, corpus, run_case
from typer.testing import CliRunner

from agentrft.cli.main import app

CASES = corpus(seed=13, n_random=10)
runner = CliRunner()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = run_case(case, tmp_path, lambda argv: runner.invoke(app, argv), monkeypatch.setattr)
    assert out.traceback is None, out.traceback
    assert "Traceback" not in out.stdout + out.stderr
    if case.expect == 2:
        assert out.exit_code == 2, f"exit {out.exit_code}, stderr {out.stderr!r}"
    else:
        assert out.reached_model or out.exit_code in (0, 2), f"exit {out.exit_code}, stderr {out.stderr!r}"
    if out.exit_code == 2:
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
        assert out.violations == []


def test_the_corpus_covers_every_command_and_cause() -> None:
    kinds = {c.kind for c in CASES}
    for kind in (
        "empty", "blank", "binary", "utf16", "utf16-no-bom", "latin1", "nul-bytes", "lone-surrogate",
        "deep-list", "deep-unclosed", "nan", "infinity", "huge-int", "alias-bomb",
    ):  # fmt: skip
        assert kind in kinds, kind
    assert {c.command for c in CASES} == {"grade", "traj", "traj-chat", "train", "eval", "finqa", "dpo"}
    assert sum(c.expect is None for c in CASES) >= 100  # the seeded wrong-type mutations
    assert corpus(seed=13, n_random=10) == CASES  # deterministic for a seed
