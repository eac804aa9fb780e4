"""Count tracebacks (and wrong exit codes) of the CLI over the bad-input corpus.

    PYTHONPATH=src .venv/bin/python benchmarks/bad_input_tracebacks.py [--seed 13] [--random 10] [--show]
        [--real-eval-policy]

Runs every case of `tests/cli/bad_input_corpus.py` in process (typer's CliRunner, model loaders
stubbed) against whichever `agentrft` is importable, so pointing PYTHONPATH at an older checkout
measures that one. Prints, per command, how many cases ended in a traceback, by exception type;
how many bad inputs were accepted (exit 0, or reached the model loader) when they must be refused;
exit codes other than 2 for refused input; refusals that printed more than one stderr line; and
refusals that left something half-written (a run dir, a changed store).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cli"))

from bad_input_corpus import corpus, run_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--random", type=int, default=10, help="seeded wrong-type mutations per input file")
    ap.add_argument("--show", action="store_true", help="print each traceback's last line")
    ap.add_argument(
        "--real-eval-policy",
        action="store_true",
        help="eval cases that pass the input checks run the real tiny policy (slower; shows later failures)",
    )
    args = ap.parse_args()

    from typer.testing import CliRunner

    from agentrft.cli.main import app

    runner = CliRunner()
    cases = corpus(args.seed, args.random)
    tracebacks: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    accepted, wrong_code, many_lines, half_written = [], [], [], []
    n_by_command: collections.Counter[str] = collections.Counter()
    for case in cases:
        undo: list[tuple[Any, str, Any]] = []

        def patch(obj: Any, name: str, value: Any, undo: list[tuple[Any, str, Any]] = undo) -> None:
            undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        with tempfile.TemporaryDirectory() as tmp:
            try:
                out = run_case(
                    case,
                    Path(tmp),
                    lambda argv: runner.invoke(app, argv),
                    patch,
                    real_eval_policy=args.real_eval_policy,
                )
            finally:
                for obj, name, value in reversed(undo):
                    setattr(obj, name, value)
        n_by_command[case.command] += 1
        if out.traceback is not None:
            tracebacks[case.command][out.exception_type or "?"] += 1
            if args.show:
                print(f"{case.name}: {out.traceback.strip().splitlines()[-1][:160]}")
            continue
        if case.expect == 2 and (out.reached_model or out.exit_code == 0):
            accepted.append(case.name)
        elif out.exit_code not in (0, 2, None):
            wrong_code.append(f"{case.name} -> {out.exit_code}: {out.stderr.strip()[:120]}")
        if out.exit_code not in (0, None) and len(out.stderr.strip().splitlines()) != 1:
            many_lines.append(case.name)
        if out.violations:
            half_written.append(f"{case.name}: {'; '.join(out.violations)}")

    total_tb = sum(sum(c.values()) for c in tracebacks.values())
    print(f"{len(cases)} cases (seed {args.seed}, {args.random} random per file): {total_tb} tracebacks")
    for command, n in sorted(n_by_command.items()):
        c = tracebacks.get(command, collections.Counter())
        detail = ", ".join(f"{k} {v}" for k, v in c.most_common())
        print(f"  {command:10} {n:4} cases  {sum(c.values()):4} tracebacks  {detail}")
    for title, items in (
        ("bad input accepted (exit 0 or reached the model)", accepted),
        ("refused with an exit code other than 2", wrong_code),
        ("refused with other than one stderr line", many_lines),
        ("refused but half-written", half_written),
    ):
        print(f"{title}: {len(items)}")
        for item in items if args.show else items[:20]:
            print(f"    {item}")


if __name__ == "__main__":
    main()
