"""Training: the GRPO/DAPO loop and its parts (config, packing, log-probs, update, checkpoints, metrics).

Public API: ``train(config, run_dir, *, resume=False) -> TrainResult`` and the config
models (``TrainConfig``, ``load_config``, ``PRESETS``). The loop (and with it torch) is
imported on first use, so that reading and checking a config stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrft.train.config import PRESETS, ConfigError, TrainConfig, load_config

if TYPE_CHECKING:
    from agentrft.train.loop import Components, TrainResult, train

_LOOP_NAMES = ("Components", "TrainResult", "train")


def __getattr__(name: str) -> Any:
    if name in _LOOP_NAMES:
        from agentrft.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'agentrft.train' has no attribute {name!r}")


__all__ = ["PRESETS", "Components", "ConfigError", "TrainConfig", "TrainResult", "load_config", "train"]
