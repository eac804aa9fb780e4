"""ARCHITECTURE.md stays true to the code: every file and folder it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "agentrft"
# where a name in the document may live: the package (and its sub-packages, for a bare module name written in
# a sub-package's row), or the repository's own folders
PLACES = [PACKAGE, ROOT, ROOT / "docs", ROOT / "scripts", ROOT / "benchmarks"]


def _exists(name: str) -> bool:
    if any((place / name).exists() for place in PLACES):
        return True
    return "/" not in name.rstrip("/") and any(PACKAGE.rglob(name.rstrip("/")))


def test_every_file_and_folder_architecture_md_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    names = set(re.findall(r"`([A-Za-z0-9_./-]+\.(?:py|md|sh))`", text))
    names |= set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*/)`", text))
    assert names, "the document names no file: the pattern no longer matches its style"
    missing = sorted(n for n in names if not _exists(n))
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"


def test_every_package_architecture_md_names_exists() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    packages = set(re.findall(r"`agentrft\.([a-z_]+)`", text))
    missing = sorted(p for p in packages if not ((PACKAGE / p).is_dir() or (PACKAGE / f"{p}.py").is_file()))
    assert not missing, f"ARCHITECTURE.md names packages that do not exist: {missing}"
