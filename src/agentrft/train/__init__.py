"""Training: the GRPO/DAPO loop and its parts (config, packing, log-probs, update, checkpoints, metrics).

Public API: ``train(config, run_dir, *, resume=False) -> TrainResult`` and the config
models (``TrainConfig``, ``load_config``, ``PRESETS``).
"""

from agentrft.train.config import PRESETS, ConfigError, TrainConfig, load_config
from agentrft.train.loop import Components, TrainResult, train

__all__ = ["PRESETS", "Components", "ConfigError", "TrainConfig", "TrainResult", "load_config", "train"]
