"""Preference pairs: built from graded trajectories, read from and written to TRL's pairs file.

One implementation of pairing serves DPO training (`agentrft dpo`, ``method: dpo``), the
``export --format dpo`` dataset and the reward model, so a pair means the same everywhere.

**Pairing rule** (`build_pairs`; deterministic, no randomness):

* Candidates are graded trajectories that may be learned from: an episode error, a grader
  error or no grade never pairs (a failed judge is not a reward of 0). A trajectory without a
  token record is a candidate; DPO renders it through the chat template.
* Trajectories pair only with trajectories of the same task *and* the same prompt (the
  messages up to the last user message): a GRPO group, or samples of one task from several
  runs or weights versions.
* A pair (chosen c, rejected r) needs ``reward(c) - reward(r) >= margin`` (margin > 0, so
  equal rewards never pair).
* Per task at most ``per_task`` pairs, picked greedily: the largest reward gap first (so
  ``per_task=1`` is best vs worst); among equal gaps the pair whose two trajectories have been
  picked least so far, then the better-ranked ones (rank: reward, then id, i.e. age). Why: a
  group of G samples has up to G²/4 pairs; a cap keeps one task from dominating, and the
  least-used rule spreads the cap over as many different trajectories as possible instead of
  pairing the best sample with every failure.
* Tasks come in the order their first trajectory appears; pairs within a task in pick order.

**Pairs file** (`read_pairs` / `pair_row`): TRL's conversational preference layout, one JSON
object per line: ``prompt`` (a non-empty list of chat messages ending with the user's),
``chosen`` and ``rejected`` (non-empty lists of assistant and tool messages, starting with
an assistant message). Optional: ``id``, ``task_id``, ``chosen_reward``, ``rejected_reward``
(what `pair_row` writes, with ``chosen_id``/``rejected_id``). Pairs read from a file carry no
token record. A bad line is one `InputError` naming ``FILE:LINE`` and the field.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.inputs import InputError, read_jsonl
from agentrft.openai_rows import parse_messages
from agentrft.types import Message, Trajectory

DEFAULT_MARGIN = 0.1
DEFAULT_PAIRS_PER_TASK = 8


def split_prompt(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """(messages up to and including the last user message, the rest)."""
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    if last_user < 0:
        raise ValueError("trajectory has no user message, so it has no prompt")
    return list(messages[: last_user + 1]), list(messages[last_user + 1 :])


@dataclass(frozen=True)
class Pair:
    """One preference: ``chosen`` preferred over ``rejected`` after the shared ``prompt``."""

    id: str
    task_id: str
    prompt: list[Message]
    chosen: list[Message]  # assistant (and tool) messages after the prompt
    rejected: list[Message]
    where: str  # for messages: "FILE:LINE", or "trajectories C > R"
    chosen_reward: float | None = None
    rejected_reward: float | None = None
    # the source trajectories (their token records) when the pair was built from graded trajectories
    chosen_trajectory: Trajectory | None = field(default=None, repr=False)
    rejected_trajectory: Trajectory | None = field(default=None, repr=False)


@dataclass
class PairingStats:
    """What `build_pairs` saw: enough to say why there are no pairs."""

    trajectories: int = 0
    candidates: int = 0  # graded, no episode or grader error
    tasks: int = 0  # distinct (task, prompt) among candidates
    tasks_with_pairs: int = 0
    pairs: int = 0

    def describe(self) -> str:
        return (
            f"{self.trajectories} trajectories, {self.candidates} graded without error, {self.tasks} tasks, "
            f"{self.tasks_with_pairs} with a pair"
        )


def _candidate(t: Trajectory) -> bool:
    return t.untrainable_reason() in (None, "no_tokens")


def _prompt_key(t: Trajectory) -> str:
    try:
        prompt, _ = split_prompt(t.messages)
    except ValueError:
        raise InputError(f"trajectory {t.id} (task {t.task_id!r}): no user message, so no prompt to pair on") from None
    return json.dumps([m.to_openai() for m in prompt], sort_keys=True)


def _pick(group: list[Trajectory], margin: float, per_task: int) -> list[tuple[Trajectory, Trajectory]]:
    """The task's pairs by the module docstring's rule; ``group`` is in first-seen order."""
    reward = {t.id: t.grade.reward for t in group if t.grade is not None}
    best_first = sorted(group, key=lambda t: (-reward[t.id], t.id))
    worst_first = sorted(group, key=lambda t: (reward[t.id], t.id))
    c_rank = {t.id: i for i, t in enumerate(best_first)}
    r_rank = {t.id: i for i, t in enumerate(worst_first)}
    eligible = [(c, r) for c in best_first for r in worst_first if reward[c.id] - reward[r.id] >= margin]
    used: dict[str, int] = {}
    picked: list[tuple[Trajectory, Trajectory]] = []
    while eligible and len(picked) < per_task:

        def key(p: tuple[Trajectory, Trajectory]) -> tuple[float, int, int, int, int]:
            c, r = p
            uc, ur = used.get(c.id, 0), used.get(r.id, 0)
            return (reward[r.id] - reward[c.id], max(uc, ur), uc + ur, c_rank[c.id] + r_rank[r.id], c_rank[c.id])

        best = min(eligible, key=key)
        eligible.remove(best)
        picked.append(best)
        for t in best:
            used[t.id] = used.get(t.id, 0) + 1
    return picked


def build_pairs(
    trajectories: Sequence[Trajectory], *, margin: float = DEFAULT_MARGIN, per_task: int = DEFAULT_PAIRS_PER_TASK
) -> tuple[list[Pair], PairingStats]:
    """Pairs of ``trajectories`` by the rule of the module docstring, and what was seen on the way."""
    if margin <= 0:
        raise ValueError(f"margin must be > 0 (equal rewards never pair), got {margin}")
    if per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    stats = PairingStats(trajectories=len(trajectories))
    groups: dict[tuple[str, str], list[Trajectory]] = {}
    for t in trajectories:
        if not _candidate(t):
            continue
        stats.candidates += 1
        groups.setdefault((t.task_id, _prompt_key(t)), []).append(t)
    stats.tasks = len(groups)
    pairs: list[Pair] = []
    for group in groups.values():
        picked = _pick(group, margin, per_task)
        stats.tasks_with_pairs += bool(picked)
        for c, r in picked:
            prompt, chosen = split_prompt(c.messages)
            _, rejected = split_prompt(r.messages)
            assert c.grade is not None and r.grade is not None  # candidates are graded
            pairs.append(
                Pair(
                    id=f"{c.id}>{r.id}",
                    task_id=c.task_id,
                    prompt=prompt,
                    chosen=chosen,
                    rejected=rejected,
                    where=f"trajectories {c.id} > {r.id}",
                    chosen_reward=c.grade.reward,
                    rejected_reward=r.grade.reward,
                    chosen_trajectory=c,
                    rejected_trajectory=r,
                )
            )
    stats.pairs = len(pairs)
    return pairs, stats


def require_pairs(pairs: list[Pair], stats: PairingStats, *, source: str, margin: float) -> list[Pair]:
    """``pairs``, or an `InputError` saying why there are none (before any model loads)."""
    if not pairs:
        raise InputError(
            f"{source}: no pair of trajectories of one task has a reward gap >= margin {margin} ({stats.describe()})"
        )
    return pairs


# ---------------------------------------------------------------- TRL pairs file


def _dump(messages: Sequence[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in messages]


def pair_row(pair: Pair) -> dict[str, Any]:
    """The pair as one line of a TRL conversational pairs file, with its provenance alongside."""
    row: dict[str, Any] = {
        "prompt": _dump(pair.prompt),
        "chosen": _dump(pair.chosen),
        "rejected": _dump(pair.rejected),
        "id": pair.id,
        "task_id": pair.task_id,
        "chosen_reward": pair.chosen_reward,
        "rejected_reward": pair.rejected_reward,
    }
    if pair.chosen_trajectory is not None and pair.rejected_trajectory is not None:
        row["chosen_id"] = pair.chosen_trajectory.id
        row["rejected_id"] = pair.rejected_trajectory.id
    return row


def _continuation(value: Any, where: str, name: str) -> list[Message]:
    messages = parse_messages(value, where, name)
    for i, m in enumerate(messages):
        if m.role not in ("assistant", "tool"):
            raise InputError(f"{where}: field '{name}[{i}].role': must be assistant or tool, not {m.role!r}")
    if messages[0].role != "assistant":
        raise InputError(f"{where}: field '{name}[0].role': must start with an assistant message")
    return messages


def _reward(row: dict[str, Any], key: str, where: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: field '{key}': must be a number, not {type(value).__name__}")
    return float(value)


def parse_pair_row(row: dict[str, Any], where: str) -> Pair:
    """One pairs-file object as a `Pair`; ``where`` is ``FILE:LINE``."""
    for key in ("prompt", "chosen", "rejected"):
        if key not in row:
            raise InputError(f"{where}: field '{key}': missing (a pair needs prompt, chosen and rejected)")
    prompt = parse_messages(row["prompt"], where, "prompt")
    if prompt[-1].role != "user":
        raise InputError(
            f"{where}: field 'prompt[{len(prompt) - 1}].role': the prompt must end with the user's message, "
            f"not {prompt[-1].role!r}"
        )
    chosen = _continuation(row["chosen"], where, "chosen")
    rejected = _continuation(row["rejected"], where, "rejected")
    for key in ("id", "task_id"):
        if key in row and not isinstance(row[key], str):
            raise InputError(f"{where}: field '{key}': must be a string, not {type(row[key]).__name__}")
    return Pair(
        id=row.get("id") or where,
        task_id=row.get("task_id") or "",
        prompt=prompt,
        chosen=chosen,
        rejected=rejected,
        where=where,
        chosen_reward=_reward(row, "chosen_reward", where),
        rejected_reward=_reward(row, "rejected_reward", where),
    )


def read_pairs(path: str | Path) -> list[Pair]:
    """Every pair of a TRL conversational pairs file (JSONL); an empty file or a bad line is an `InputError`."""
    return [parse_pair_row(row, f"{path}:{line}") for line, row in read_jsonl(path)]


def write_pairs(pairs: Sequence[Pair], path: str | Path) -> int:
    """Write ``pairs`` as a TRL pairs file; returns the number of lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for pair in pairs:
            f.write(json.dumps(pair_row(pair), ensure_ascii=False) + "\n")
    return len(pairs)
