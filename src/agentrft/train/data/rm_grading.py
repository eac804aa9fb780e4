"""Scoring behind the `reward_model` grader (train/data/rm_grader.py, which imports this on first use).

What is scored, and where the score is read, follows the training data exactly: a token record
as recorded, read at its last sampled token; messages through the model's chat template by
`records.render_token_record` (the renderer training used; tool calls in the manifest's
``tool_format`` with its ``tool_schemas``), read at the last assistant turn's end token.
Failures are `GraderFailure` flags (the grader's docstring lists them).

A loaded model is kept per (path, manifest modification time), so every grader of one path
shares it and a retrained model at the same path is picked up. One lock serialises loading
and forward passes: graders run in threads, and one forward at a time uses the CPU best.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agentrft.graders.base import GraderFailure, Sample
from agentrft.graders.rm_manifest import MANIFEST_NAME
from agentrft.inputs import InputError
from agentrft.openai_rows import parse_messages
from agentrft.pairs import split_prompt
from agentrft.train.data.rm_model import LoadedRewardModel, load_reward_model
from agentrft.types import Message, Trajectory

_LOCK = threading.Lock()
_CACHE: dict[tuple[str, int], LoadedRewardModel] = {}


def cached_reward_model(path: Path) -> LoadedRewardModel:
    """The reward model in ``path``, loaded once per process and manifest version (call under ``_LOCK``)."""
    key = (str(path), (path / MANIFEST_NAME).stat().st_mtime_ns)
    if key not in _CACHE:
        for old in [k for k in _CACHE if k[0] == key[0]]:
            del _CACHE[old]
        _CACHE[key] = load_reward_model(path)
    return _CACHE[key]


def _render(loaded: LoadedRewardModel, prompt: list[Message], continuation: list[Message]) -> tuple[list[int], int]:
    """Token ids of ``prompt + continuation`` through the model's chat template and the index to read."""
    from agentrft.samplers.chat_template import TokenizerRenderer
    from agentrft.train.data.records import render_token_record

    tok = loaded.tokenizer
    if tok is None:
        raise GraderFailure(
            "sample_parse_error",
            "this reward model has no chat template (its policy had no tokenizer): it scores token records only",
        )
    conversation = Trajectory(id="graded", messages=[*prompt, *continuation], n_prompt_messages=len(prompt))
    m = loaded.manifest
    try:
        record = render_token_record(
            conversation, TokenizerRenderer(tok), str(m["tool_format"]), m.get("tool_schemas") or []
        )
    except InputError as exc:
        raise GraderFailure("sample_parse_error", str(exc)) from None
    return record.ids, max(i for i, keep in enumerate(record.loss_mask) if keep)


def _sequence(
    loaded: LoadedRewardModel, sample: Sample, item: dict[str, Any], use_token_record: bool
) -> tuple[list[int], int]:
    traj = sample.trajectory
    if traj is not None and traj.tokens is not None and use_token_record:
        start, end = traj.tokens.segment_spans()[-1]  # a stitched session: its last segment holds the end
        mask = traj.tokens.loss_mask[start:end]
        if not any(mask):
            raise GraderFailure("sample_parse_error", f"trajectory {traj.id}: no sampled token to score")
        return list(traj.tokens.ids[start:end]), max(i for i, m in enumerate(mask) if m)
    if traj is not None:
        try:
            prompt, continuation = split_prompt(traj.messages)
        except ValueError as exc:
            raise GraderFailure("sample_parse_error", f"trajectory {traj.id}: {exc}") from None
        if not any(m.role == "assistant" for m in continuation):
            raise GraderFailure("sample_parse_error", f"trajectory {traj.id}: no assistant turn to score")
        while continuation[-1].role != "assistant":  # what follows the last answer is not the response
            continuation.pop()
        return _render(loaded, prompt, continuation)
    if not sample.output_text:
        raise GraderFailure("sample_parse_error", "sample.output_text is empty: no response to score")
    if "messages" not in item:
        raise GraderFailure(
            "sample_parse_error",
            "the reward model scores a response after its prompt: the item needs `messages` (the prompt's chat "
            "messages), or grade the trajectory",
        )
    try:
        prompt = parse_messages(item["messages"], "item", "messages")
    except InputError as exc:
        raise GraderFailure("sample_parse_error", str(exc)) from None
    return _render(loaded, prompt, [Message(role="assistant", content=sample.output_text)])


def score_sample(path: Path, sample: Sample, item: dict[str, Any], *, use_token_record: bool) -> float:
    """The reward model's raw score ``r`` of ``sample`` (see the module docstring)."""
    with _LOCK:
        try:
            loaded = cached_reward_model(path)
        except Exception as exc:  # the files changed since the spec was loaded: not the sample's fault
            raise GraderFailure(
                "model_grader_server_error", f"cannot load the reward model in {path}: {type(exc).__name__}: {exc}"
            ) from None
        ids, last = _sequence(loaded, sample, item, use_token_record)
        try:
            return loaded.score_ids(ids, last)
        except ValueError as exc:  # token ids outside the vocabulary
            raise GraderFailure("sample_parse_error", str(exc)) from None
