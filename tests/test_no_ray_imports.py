"""Ray is an extra: no module but train/rl/ray_rollout.py imports it, even while running a whole train
(with Ray blocked, every agentrft module except that one imports, and `agentrft train --help` runs)."""

from __future__ import annotations

import subprocess
import sys

PROBE = r"""
import importlib, pkgutil, sys

class BlockRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("ray import blocked")
        return None

sys.meta_path.insert(0, BlockRay())
import agentrft
bad = []
for info in pkgutil.walk_packages(agentrft.__path__, "agentrft."):
    if info.name.endswith(("__main__", "ray_rollout")):
        continue
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        if "ray import blocked" in str(exc):
            bad.append(info.name)
    except Exception:
        pass
import agentrft.train.rl.ray_rollout  # the module itself imports ray only when a RayPlayer starts
print(",".join(bad))
"""


def test_nothing_but_ray_rollout_imports_ray() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "", out.stdout
