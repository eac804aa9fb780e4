"""What makes a directory a reward model, readable without torch (the grader checks it at load time).

``RUN_DIR/reward_model/`` as `train/data/reward_model.py` writes it:

    manifest.json      this module's `FORMAT`; the base policy, the body, the head, the chat template's
                       source, the tool-call format, what the score means, the held-out accuracy
    body/              full fine-tuning: the causal LM in Hugging Face form (loads as policy ``hf:PATH``)
    adapter/           LoRA: the peft adapter, applied to ``base_policy`` (loaded by name, ``base_seed``)
    head.safetensors   the scalar head: ``weight`` (1, H) and ``bias`` (1,)
    tokenizer/         the policy's tokenizer and chat template (absent when the policy had none)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
FORMAT = "agentrft.reward_model/1"
SCORE_MEANING = (
    "r(x, y): a Bradley-Terry logit read from the hidden state of the last loss token of the prompt x "
    "followed by the response y; P(y_w preferred to y_l | x) = sigmoid(r(x, y_w) - r(x, y_l)). The "
    "reward_model grader's reward is sigmoid(r)"
)
_REQUIRED = ("format", "base_policy", "finetune", "head", "hidden_size", "tool_format")


class ManifestError(ValueError):
    """``path`` holds no readable reward model; the message says what is missing."""


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the reward model in ``path``, after checking the files it names are there."""
    root = Path(path)
    if not root.is_dir():
        raise ManifestError(f"{root}: no such directory (a reward model is a directory: RUN_DIR/reward_model)")
    file = root / MANIFEST_NAME
    if not file.is_file():
        raise ManifestError(
            f"{root}: holds no reward model ({MANIFEST_NAME} missing; train one with method: reward_model)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{file}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ManifestError(f"{file}: not a reward model manifest (format {got!r}, expected {FORMAT!r})")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ManifestError(f"{file}: field '{missing[0]}' missing")
    body = "adapter" if data["finetune"] == "lora" else "body"
    for name in (body, data["head"]):
        if not (root / name).exists():
            raise ManifestError(f"{root}: {name} missing (an incomplete copy?)")
    return data
