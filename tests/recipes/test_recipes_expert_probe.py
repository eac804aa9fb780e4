"""The teacher-forced probe (recipes/expert_probe.py): the expert's turns scored under a policy, checked against
log-softmax recomputed by hand from the model's logits."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from agentrft.envs.registry import make_env
from agentrft.inputs import InputError
from agentrft.recipes.expert_probe import expert_episodes, probe
from agentrft.samplers.distribution import Distribution
from agentrft.samplers.policies import load_model_and_tokenizer


def test_the_probe_scores_each_expert_turn_as_log_softmax_by_hand() -> None:
    model, tokenizer = load_model_and_tokenizer("tiny", seed=0)
    env = make_env("finqa-lite:3?shots=0")
    episodes = expert_episodes(env, tokenizer, "held-out", 2)
    assert len(episodes) == 2 and all(t.grade is not None and t.grade.success for t in episodes)
    result = probe(model, episodes, Distribution(temperature=0.7))
    assert result.episodes == 2 and sorted(result.turn_logp) == [0, 1, 2, 3]  # search, open, calculate, answer
    by_hand: dict[int, list[float]] = {}
    for t in episodes:
        assert t.tokens is not None
        ids = torch.tensor([t.tokens.ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double() / 0.7, -1)
        turns: dict[int, float] = {}
        for i in range(1, len(t.tokens.ids)):  # token i is predicted at position i - 1
            if t.tokens.loss_mask[i]:
                k = t.tokens.turn[i]
                turns[k] = turns.get(k, 0.0) + float(logp[i - 1, t.tokens.ids[i]])
        for k, v in turns.items():
            by_hand.setdefault(k, []).append(v)
    for k, v in by_hand.items():
        assert result.turn_logp[k] == pytest.approx(sum(v) / 2, rel=1e-4, abs=1e-3)
        assert result.turn_p[k] == pytest.approx(sum(math.exp(x) for x in v) / 2, rel=1e-3, abs=1e-12)
    assert result.episode_logp == pytest.approx(sum(result.turn_logp.values()), rel=1e-9)


def test_the_probe_refuses_an_environment_without_an_expert(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"}\n')
    _, tokenizer = load_model_and_tokenizer("tiny", seed=0)
    with pytest.raises(InputError, match="has no expert"):
        expert_episodes(make_env(f"jsonl:{data}"), tokenizer, "train", 1)


def test_the_script_prints_each_levels_turns(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
    try:
        import agentic_probe
    finally:
        sys.path.pop(0)
    written = tmp_path / "run" / "probe.json"
    out = agentic_probe.main(["tiny", "--levels", "4", "--tasks", "1", "--out", str(written)])
    assert out["4"]["episodes"] == 1 and len(out["4"]["turn_p"]) == 8  # type: ignore[index]
    assert '"turn_p"' in capsys.readouterr().out
    assert json.loads(written.read_text()) == json.loads(json.dumps(out))  # the printed JSON, keys as text
