"""`reward_model` grader: a Bradley–Terry reward model trained with ``agentrft train`` (``method: reward_model``).

Spec (agentrft): ``{"type": "reward_model", "path": "RUN_DIR/reward_model"}``, optional ``name``,
``pass_threshold`` (in (0, 1), default 0.5) and ``use_token_record`` (default true). ``path``
is relative to the spec file's directory (the cwd for a spec given inline) and must hold a
reward model (`rm_manifest`): otherwise the spec is refused at load time, naming ``path``.

Reward: ``sigmoid(r)`` in (0, 1), ``r`` the model's score (`rm_manifest.SCORE_MEANING`),
kept in ``metadata["score"]``. Success: reward ≥ ``pass_threshold``; the default 0.5 is
``r ≥ 0``, which the training's centring term makes "preferred more often than not".

What is scored:

* a trajectory with a token record (and ``use_token_record``): exactly its recorded tokens,
  read at the last sampled token, as training on a store reads them. Set it false for
  trajectories sampled with another tokenizer than the reward model's;
* a trajectory without one: its messages through the reward model's chat template, tool
  calls written in the manifest's ``tool_format``, read at the end of the last assistant turn;
* a sample without a trajectory: the item's ``messages`` (when it has them: the prompt)
  followed by ``output_text`` as the assistant's answer.

Flags (reward 0 with the flag, never a silent 0): the model cannot be loaded or run (files
gone or corrupt since the spec was loaded) → ``model_grader_server_error``; a non-finite
score → ``model_grader_parse_error``; nothing to score (no response, an item's ``messages``
that are not chat messages, a conversation the template cannot render, token ids outside the
model's vocabulary) → ``sample_parse_error``.

Torch is imported on the first grade, not at load time (graders stay light). The model is
loaded once per process and path and shared by every grader of that path; forward passes
run one at a time, in a worker thread (``agrade`` does not block the event loop).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any, Literal

from agentrft.graders.base import Grader, GraderFailure, GraderSpecError, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.graders.rm_manifest import ManifestError, read_manifest

DEFAULT_PASS_THRESHOLD = 0.5


class RewardModelSpec(SpecBase):
    type: Literal["reward_model"]
    path: str
    use_token_record: bool = True


@register_grader("reward_model")
class RewardModelGrader(Grader):
    Spec = RewardModelSpec
    is_async = True  # a forward pass: run in a thread so the event loop keeps going

    def __init__(self, name: str, path: Path, manifest: dict[str, Any], spec: RewardModelSpec) -> None:
        threshold = DEFAULT_PASS_THRESHOLD if spec.pass_threshold is None else spec.pass_threshold
        super().__init__(name, threshold, max_reward=1.0)
        self.path = path
        self.manifest = manifest
        self.use_token_record = spec.use_token_record

    @classmethod
    def build(cls, spec: RewardModelSpec, where: str, options: LoadOptions) -> RewardModelGrader:
        pre = f"{where}." if where else ""
        path = Path(spec.path)
        if not path.is_absolute() and options.base_dir is not None:
            path = Path(options.base_dir) / path
        try:
            manifest = read_manifest(path)
        except ManifestError as exc:
            raise GraderSpecError(f"{pre}path", str(exc)) from None
        t = spec.pass_threshold
        if t is not None and not (math.isfinite(t) and 0.0 < t < 1.0):
            raise GraderSpecError(f"{pre}pass_threshold", f"must be in (0, 1) (the reward is sigmoid(score)), got {t}")
        return cls(spec.name or "reward_model", path.resolve(), manifest, spec)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        return self._finish(self._run(sample, item))

    async def ascore(self, sample: Sample, item: dict[str, Any]) -> Score:
        return self._finish(await asyncio.to_thread(self._run, sample, item))

    def _run(self, sample: Sample, item: dict[str, Any]) -> float:
        from agentrft.train.data.rm_grading import score_sample  # torch: on first use only

        return score_sample(self.path, sample, item, use_token_record=self.use_token_record)

    def _finish(self, r: float) -> Score:
        if not math.isfinite(r):
            raise GraderFailure("model_grader_parse_error", f"the reward model scored {r}")
        reward = 1.0 / (1.0 + math.exp(-r)) if r >= 0 else math.exp(r) / (1.0 + math.exp(r))
        return Score(reward, metadata={"score": r})
