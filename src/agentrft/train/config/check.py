"""`check_references(cfg)`: resolve what a validated config names (environment and its splits, grader spec,
policy, and for the methods that learn from recorded trajectories the selection and every selected token
record) without loading a model, so that a bad config fails before a run directory is written."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentrft.inputs import InputError
from agentrft.store.errors import StoreError
from agentrft.train.config import ConfigError, TrainConfig
from agentrft.train.config.method import DATA_METHODS

if TYPE_CHECKING:
    from agentrft.envs.base import Environment


def check_references(cfg: TrainConfig, source: str = "config", env: Environment | None = None) -> None:
    """Resolve what `cfg` names without loading a model: the environment (its tasks are read, so a
    bad dataset fails here; ``env``: the one a caller already built from ``cfg.rollout.env``), the train
    and eval splits, the grader spec and the policy name; for ``sft`` the data selection and every selected
    trajectory (`_check_data`). ConfigError names the key. Training calls nothing else that can refuse the config."""
    from agentrft.envs.registry import make_env
    from agentrft.graders import load_grader
    from agentrft.samplers.policies import POLICY_NAMES, is_in_process

    def refuse(key: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {key}: {why}")

    if not is_in_process(cfg.policy.name):
        trainable = [n for n in POLICY_NAMES if is_in_process(n.replace("PATH_OR_ID", "x"))]
        raise refuse("policy.name", f"{cfg.policy.name!r} cannot be trained in process; valid: {', '.join(trainable)}")
    try:
        env = env or make_env(cfg.rollout.env)
    except InputError as exc:
        raise refuse("rollout.env", str(exc)) from None
    splits = [("rollout.split", cfg.rollout.split)] + ([("eval.split", cfg.eval.split)] if cfg.eval.every_steps else [])
    for key, split in splits:
        try:
            tasks = env.tasks(split)
        except InputError as exc:
            raise refuse(key, str(exc)) from None
        if not tasks:
            raise refuse(key, f"environment {cfg.rollout.env!r} has no tasks in split {split!r}")
    try:
        load_grader(cfg.rollout.grader or env.grader_spec())
    except InputError as exc:
        raise refuse("rollout.grader", str(exc)) from None
    if cfg.tripwires.check_grader is not None:
        try:
            load_grader(cfg.tripwires.check_grader)
        except InputError as exc:
            raise refuse("tripwires.check_grader", str(exc)) from None
    if cfg.optimizer.weights == "bf16":
        from agentrft.precision import resolve

        if "fp32" in (resolve(cfg.policy.precision), resolve(cfg.policy.sampler_precision)):
            raise refuse(
                "optimizer.weights",
                "bf16 weights compute in bf16, and policy.precision or sampler_precision resolves to fp32 here "
                "(auto: this CPU does not multiply bf16 natively)",
            )
    if cfg.rollout.branch is not None:
        from agentrft.store import Store
        from agentrft.train.rl.branches import BranchSource, after_tool

        if (tool := after_tool(cfg.rollout.branch.turn)) is not None:
            names = sorted(str(s.get("function", {}).get("name")) for s in env.tool_schemas())
            if tool not in names:
                raise refuse("rollout.branch.turn", f"the environment has no tool {tool!r}; its tools: {names}")
        try:
            with Store.open_existing(cfg.rollout.branch.db) as store:
                tasks, schemas = env.tasks(cfg.rollout.split), env.tool_schema_hash()
                BranchSource.from_store(cfg.rollout.branch, store, tasks, cfg.seed, schemas)
        except (InputError, StoreError) as exc:
            raise refuse("rollout.branch", str(exc).removeprefix("rollout.branch: ")) from None
    if cfg.agent is not None:
        if cfg.method != "grpo":
            raise refuse("agent", f"agent.command runs episodes for method grpo, not {cfg.method}")
        if (why := cfg.agent.missing_program()) is not None:
            raise refuse("agent.command", why)
    if cfg.method in DATA_METHODS:
        _check_data(cfg, env.tool_schemas(), source)


def _check_data(cfg: TrainConfig, tool_schemas: list[dict[str, Any]], source: str) -> None:
    """The selection is not empty and every selected trajectory can be learned from: its token record fits its
    messages, or (none recorded) the policy's chat template renders it. Loads the tokenizer only to render."""
    from agentrft.samplers.chat_template import TokenizerRenderer
    from agentrft.samplers.policies import PolicyError, load_tokenizer
    from agentrft.train.data import select_trajectories
    from agentrft.train.data.records import learnable_records

    if cfg.data.source is None:
        raise ConfigError(
            f"{source}: data.source: method {cfg.method} learns from recorded trajectories; name a store (.db) "
            "or a trajectory export (.jsonl, .parquet)"
        )
    try:
        trajs, _ = select_trajectories(cfg.data)
        renderer, vocab = None, None
        if any(t.tokens is None for t in trajs):
            try:
                tokenizer = load_tokenizer(cfg.policy.name)
            except PolicyError as exc:
                raise ConfigError(f"{source}: policy.name: {exc}") from None
            renderer, vocab = TokenizerRenderer(tokenizer), len(tokenizer)
        learnable_records(
            trajs,
            renderer=renderer,
            tool_format=cfg.rollout.tool_format,
            tool_schemas=tool_schemas,
            vocab_size=vocab,
        )
    except ConfigError:
        raise
    except InputError as exc:
        raise ConfigError(f"{source}: {exc}") from None
