"""The reward model: a causal LM's decoder body and a scalar head on the last loss token's hidden state.

``r(x, y) = w · h_last + b``, where ``h_last`` is the body's final (normed) hidden state at the
last loss token of the sequence ``x + y`` (the end of the response: the token a sampler stopped
on, or the rendered turn's end-of-sequence token) and ``w``, ``b`` start at 0, so every score is
0 and every pair's loss ``log 2`` before the first step. The language-model head is not used.

Scores are computed on a plain right-padded micro-batch or on its prefix-tree packing
(`shared_prefix`): a token's hidden state depends only on the tokens it attends to and its
position, the same in both, so the two give the same scores (tests check it).

`save_reward_model` / `load_reward_model` write and read the directory that
`graders/rm_manifest.py` describes; the ``reward_model`` grader loads it by path.

Shape legend: B = sequences, T = their longest length, R = packed rows, L = longest packed row,
H = hidden size.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentrft.graders.rm_manifest import FORMAT, MANIFEST_NAME, SCORE_MEANING, read_manifest
from agentrft.train.core.logprobs import _body_and_head
from agentrft.train.core.packing import MicroBatch
from agentrft.train.core.shared_prefix import packed_hidden

HEAD_NAME = "head.safetensors"


class RewardModel(torch.nn.Module):
    """``lm`` (a causal LM, or its peft wrapper) with a scalar ``head`` (H -> 1, zero-initialised)."""

    def __init__(self, lm: Any, hidden_size: int | None = None) -> None:
        super().__init__()
        self.lm = lm
        body = self.body
        size = hidden_size or int(body.config.hidden_size)
        param = next(body.parameters())
        self.head = torch.nn.Linear(size, 1, dtype=param.dtype, device=param.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @property
    def body(self) -> Any:
        """The decoder body: hidden states, no language-model head (through a peft wrapper if any)."""
        return _body_and_head(self.lm)[0]

    def score_hidden(self, h: Tensor) -> Tensor:
        """(B,) scores of (B, H) hidden states; the head runs in its own precision, outside any autocast."""
        with torch.autocast(h.device.type, enabled=False):
            return self.head(h.to(self.head.weight.dtype)).squeeze(-1)


def last_loss_index(loss_mask: Tensor) -> Tensor:
    """(B,) index of each row's last loss token; a row without one is refused."""
    has = loss_mask.bool()
    if not bool(has.any(-1).all()):
        raise ValueError("every sequence needs a loss token (the response) to read its score at")
    width = loss_mask.shape[-1]
    return (width - 1 - has.flip(-1).to(torch.long).argmax(-1)).to(torch.long)


def sequence_scores(rm: RewardModel, mb: MicroBatch) -> Tensor:
    """(B,) scores of the micro-batch's sequences, on its prefix-tree packing when it has one."""
    body = rm.body
    last = last_loss_index(mb.loss_mask)
    rows_b = torch.arange(last.shape[0])
    if mb.shared is not None:
        rows = mb.shared
        hidden = packed_hidden(body, rows)  # (R, L, H)
        h = hidden[rows.seq_row, rows.seq_cols[rows_b, last]]
    else:
        hidden = body(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state  # (B, T, H)
        h = hidden[rows_b, last]
    return rm.score_hidden(h)


# ---------------------------------------------------------------- saving and loading


def save_reward_model(rm: RewardModel, tokenizer: Any, path: Path, manifest: dict[str, Any]) -> Path:
    """Write ``rm`` to ``path`` (replaced whole, via a temporary directory beside it): the body (full) or
    the adapter (LoRA), the head, the tokenizer and ``manifest`` completed with the format's fields."""
    from safetensors.torch import save_file

    finetune = manifest["finetune"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    rm.lm.save_pretrained(tmp / ("adapter" if finetune == "lora" else "body"))
    head = {k: v.detach().contiguous().cpu() for k, v in rm.head.state_dict().items()}
    save_file(head, str(tmp / HEAD_NAME))
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "tokenizer")
    full = {
        "format": FORMAT,
        **manifest,
        "head": HEAD_NAME,
        "hidden_size": int(rm.head.in_features),
        "score": SCORE_MEANING,
        "chat_template_source": "tokenizer/ (the policy's tokenizer and chat template, saved with the model)"
        if tokenizer is not None
        else None,
    }
    (tmp / MANIFEST_NAME).write_text(json.dumps(full, indent=2, sort_keys=True) + "\n")
    os.chmod(tmp, 0o755)
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)
    return path


@dataclass
class LoadedRewardModel:
    """A reward model ready to score: eval mode, no gradients."""

    model: RewardModel
    tokenizer: Any  # None when the policy had no tokenizer (token records only)
    manifest: dict[str, Any]
    vocab_size: int

    @torch.no_grad()
    def score_ids(self, ids: list[int], last: int) -> float:
        """The score of one token sequence, read at index ``last`` (its last loss token)."""
        if not 0 <= last < len(ids):
            raise ValueError(f"score position {last} outside a sequence of {len(ids)} tokens")
        top = max(ids)
        if top >= self.vocab_size or min(ids) < 0:
            raise ValueError(
                f"token id {top} is outside the reward model's vocabulary of {self.vocab_size} "
                "(sampled with another tokenizer? set use_token_record: false to render the messages instead)"
            )
        input_ids = torch.tensor([ids], dtype=torch.long)
        hidden = self.model.body(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
        return float(self.model.score_hidden(hidden[0, last : last + 1])[0])


def load_reward_model(path: str | Path) -> LoadedRewardModel:
    """The reward model saved in ``path`` (`save_reward_model`); LoRA: its base policy loaded by name first."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = Path(path)
    manifest = read_manifest(root)
    if manifest["finetune"] == "lora":
        from peft import PeftModel

        from agentrft.samplers.policies import load_model_and_tokenizer

        base, _ = load_model_and_tokenizer(manifest["base_policy"], seed=int(manifest.get("base_seed", 0)))
        lm = PeftModel.from_pretrained(base, root / "adapter").merge_and_unload()
    else:
        lm = AutoModelForCausalLM.from_pretrained(root / "body", dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer") if (root / "tokenizer").is_dir() else None
    rm = RewardModel(lm, int(manifest["hidden_size"]))
    head = load_file(str(root / manifest["head"]))
    rm.head.load_state_dict({k: v.to(rm.head.weight.dtype) for k, v in head.items()})
    rm.eval().requires_grad_(False)
    vocab = int(lm.get_input_embeddings().weight.shape[0])
    return LoadedRewardModel(rm, tokenizer, manifest, vocab)
