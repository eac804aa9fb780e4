"""A GRPO checkpoint's weights as a policy directory `hf:` loads (run from the repo root):
`python export_checkpoint.py BASE_POLICY_DIR CHECKPOINT_DIR OUT_DIR`. Used for the level-3 run stopped at its
step-8 checkpoint for the session's time (full fine-tuning: the checkpoint holds every weight by name)."""

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrft.train.core.checkpoint import export_policy

base, checkpoint, out = (Path(a) for a in sys.argv[1:4])
model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
weights = torch.load(checkpoint / "trainable.pt", weights_only=True)
missing, unexpected = model.load_state_dict(weights, strict=False)
assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # lm_head is tied
export_policy(model, AutoTokenizer.from_pretrained(base), out)
print(f"{checkpoint} -> {out}: {len(weights)} tensors")
