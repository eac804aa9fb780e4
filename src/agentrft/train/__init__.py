"""Training: the GRPO/DAPO loop and its parts (config, packing, log-probs, update, checkpoints, metrics).

Public API: ``train(config, run_dir, *, resume=False) -> TrainResult`` and the config
models (``TrainConfig``, ``load_config``, ``PRESETS``). Each is imported on first use: the loop (and
with it torch) so that reading and checking a config stays fast, the config models (pydantic) so that
importing a light submodule (``agentrft.train.presets`` for the CLI's help) costs nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrft.train.config import PRESETS, ConfigError, TrainConfig, load_config
    from agentrft.train.loop import Components, TrainResult, train

_LOOP_NAMES = ("Components", "TrainResult", "train")
_CONFIG_NAMES = ("PRESETS", "ConfigError", "TrainConfig", "load_config")


def __getattr__(name: str) -> Any:
    if name in _LOOP_NAMES:
        from agentrft.train import loop

        return getattr(loop, name)
    if name in _CONFIG_NAMES:
        from agentrft.train import config

        return getattr(config, name)
    raise AttributeError(f"module 'agentrft.train' has no attribute {name!r}")


__all__ = ["PRESETS", "Components", "ConfigError", "TrainConfig", "TrainResult", "load_config", "train"]
