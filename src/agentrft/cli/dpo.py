"""`agentrft dpo (--pairs PAIRS.jsonl | --db STORE) --policy P --run-dir D [--set k=v ...] [--resume]`.

DPO (or IPO, length-normalised DPO: ``--set dpo.loss=ipo``) from a TRL pairs file, or from pairs
built out of a store's graded trajectories (``--db``, filtered by ``--set data.runs=[NAME]`` and the
other ``data`` keys). The same config as ``agentrft train`` with ``method: dpo`` (flags fill
``policy.name``, ``dpo.pairs``, ``data.source``; ``--set`` sets any key), the same checks before
anything is written, the same run dir: metrics.jsonl, checkpoints, ``policy/``, plus ``pairs.jsonl``
(what was trained on) and ``dpo_reference.pt`` (the reference log-probs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from agentrft.cli.train import run_training


def dpo_cmd(
    pairs: Path = typer.Option(None, "--pairs", help="TRL pairs file: JSONL rows of prompt, chosen, rejected."),
    db: Path = typer.Option(None, "--db", help="A store (or trajectory export) to build pairs from."),
    policy: str = typer.Option("smollm2-135m", "--policy", help="Policy to train: smollm2-135m, tiny, hf:PATH."),
    set_: list[str] = typer.Option(
        [], "--set", help="Any config key, e.g. --set dpo.beta=0.2 --set data.runs=[demo2] (repeatable)."
    ),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where config, checkpoints, metrics and the policy go."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run dir's latest checkpoint."),
    allow_config_change: bool = typer.Option(
        False, "--allow-config-change", help="With --resume: continue even though the config differs."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the final metrics as one JSON object."),
) -> None:
    """Preference-tune a policy on pairs (DPO); metrics (loss, rewards/accuracy, margin) go to RUN_DIR/metrics.jsonl."""
    from agentrft.train.config import build_config

    base: dict[str, Any] = {"method": "dpo", "policy": {"name": policy}}
    if pairs is not None:
        base["dpo"] = {"pairs": str(pairs)}
    if db is not None:
        base["data"] = {"source": str(db)}
    run_training(
        build_config(base, set_, source="agentrft dpo"), "agentrft dpo", run_dir, resume, allow_config_change, as_json
    )


def register(app: typer.Typer) -> None:
    app.command("dpo")(dpo_cmd)
