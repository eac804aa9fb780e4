"""Environments: the interface (`base`), built-in envs and `make_env`."""

from agentrft.envs.registry import make_env

__all__ = ["make_env"]
