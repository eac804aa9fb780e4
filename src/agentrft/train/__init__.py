"""Training: one driver, `train()` (`loop.py`), for every method, on one training core.

Sub-packages: `core` (session, update, log-probs, packing, checkpoints, resume, metrics), `rl` (GRPO/DAPO
steps, task sources, the asynchronous pipeline, Ray workers, tripwires), `data` (learning from recorded
trajectories: selection, SFT, rejection sampling, DPO, the reward model), `config` (the config models and
presets). Public API: ``train(config, run_dir, *, resume=False) -> TrainResult`` and the config models
(``TrainConfig``, ``load_config``, ``PRESETS``), each imported on first use: the loop (and with it torch) so
that reading and checking a config stays fast.
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
