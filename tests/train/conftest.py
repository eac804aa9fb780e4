"""Shared fakes for the train tests: a tiny Llama (no tokenizer, no hub) and synthetic trajectories."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrft.types import Grade, TokenRecord, Trajectory

VOCAB = 97

# Tiny models on a shared 2-core box: one intra-op thread is ~30x faster than two contending ones.
torch.set_num_threads(1)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64) -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype)


def fake_trajectory(rng: random.Random, turns: int = 2, group: str = "g0", reward: float = 0.0) -> Trajectory:
    """Prompt tokens, then per turn some sampled tokens followed by tool-result tokens."""
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    turn: list[int] = []
    for k in range(turns):
        n_prompt = rng.randint(2, 6)
        n_sampled = rng.randint(1, 5)
        ids += [rng.randrange(VOCAB) for _ in range(n_prompt + n_sampled)]
        mask += [0] * n_prompt + [1] * n_sampled
        lps += [0.0] * n_prompt + [-rng.random() for _ in range(n_sampled)]
        turn += [k] * (n_prompt + n_sampled)
    return Trajectory(
        task_id=group,
        group_id=group,
        tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=lps, turn=turn),
        grade=Grade(reward=reward),
    )


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)
