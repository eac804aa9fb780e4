"""Write docs/config.md, the training config's reference, from the pydantic models (train/config/reference.py).

    .venv/bin/python scripts/config_reference.py [--check]

``--check`` writes nothing and exits 1 when the page differs from what the code generates (CI runs the test
that does the same: tests/train/test_train_config_reference.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentrft.train.config.reference import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"

if __name__ == "__main__":
    text = reference_markdown()
    if "--check" in sys.argv[1:]:
        current = PAGE.read_text() if PAGE.exists() else ""
        sys.exit(0 if current == text else f"{PAGE} is stale: run python scripts/config_reference.py")
    PAGE.write_text(text)
    print(f"wrote {PAGE} ({len(text.splitlines())} lines)")
