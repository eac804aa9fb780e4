"""Layers 1-4 and `rollout` must import without torch (ARCHITECTURE.md).

In a fresh interpreter a meta-path finder makes `import torch` fail, then every
module found under the light packages *at test time* is imported, so modules
added later are covered without editing this test.
"""

from __future__ import annotations

import json
import subprocess
import sys

LIGHT_PACKAGES = (
    "agentrft.types",
    "agentrft.arith",
    "agentrft.http_retry",
    "agentrft.store",
    "agentrft.tools",
    "agentrft.envs",
    "agentrft.graders",
    "agentrft.rollout",
    "agentrft.rft",  # a job is validated before anything loads; its runner imports the trainer on first use
)

PROBE = r"""
import importlib, json, pkgutil, sys, traceback

PACKAGES = json.loads(sys.argv[1])
current = [None]


class BlockTorch:
    # Raising from find_spec makes `import torch` (and any torch.*) fail at once.
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch import blocked (while importing {current[0]})")
        return None


sys.meta_path.insert(0, BlockTorch())

names, failures = [], []
for pkg in PACKAGES:
    names.append(pkg)
    try:
        module = importlib.import_module(pkg)
    except BaseException:
        failures.append((pkg, traceback.format_exc(limit=-3)))
        continue
    if hasattr(module, "__path__"):
        walk_errors = []
        for info in pkgutil.walk_packages(module.__path__, pkg + ".", onerror=walk_errors.append):
            if not info.name.endswith("__main__"):
                names.append(info.name)
        failures += [(name, "failed while walking the package") for name in walk_errors]

for name in names:
    current[0] = name
    try:
        importlib.import_module(name)
    except BaseException:
        failures.append((name, traceback.format_exc(limit=-3)))

print(json.dumps({"modules": names, "failures": failures, "torch_loaded": "torch" in sys.modules}))
"""


def test_light_layers_import_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(LIGHT_PACKAGES)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    failures = "\n".join(f"--- {name}\n{tb}" for name, tb in result["failures"])
    assert not result["failures"], f"modules that fail to import without torch:\n{failures}"
    assert result["torch_loaded"] is False
    # the walk really found the packages' modules (guards against a probe that imports nothing)
    assert {"agentrft.types", "agentrft.store.sqlite_store", "agentrft.store.io"} <= set(result["modules"])


def test_blocker_catches_a_torch_import() -> None:
    """The probe's blocker is effective: a module that imports torch is reported."""
    probe = PROBE.replace("PACKAGES = json.loads(sys.argv[1])", "PACKAGES = []")
    code = probe.replace("for name in names:", "names.append('torch.nn')\nfor name in names:")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [name for name, _ in result["failures"]] == ["torch.nn"]
    assert "torch import blocked" in result["failures"][0][1]
    assert result["torch_loaded"] is False
