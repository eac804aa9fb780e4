"""docs/config.md is what the config models generate now (train/config/reference.py), and it names every key."""

from __future__ import annotations

from pathlib import Path

from agentrft.train.config import TrainConfig
from agentrft.train.config.reference import reference_markdown, sections

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_the_reference_page_is_current() -> None:
    assert PAGE.read_text() == reference_markdown(), "docs/config.md is stale: run python scripts/config_reference.py"


def test_every_key_of_every_section_is_on_the_page() -> None:
    text = reference_markdown()
    keys = [
        path + (field.alias or name)
        for path, model in sections(TrainConfig)
        for name, field in model.model_fields.items()
    ]
    assert len(keys) > 140 and "rollout.branch.turn" in keys and "async.max_staleness" in keys
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing
