"""Small fakes for the eval tests: trajectories, an in-memory store, a fake env / runner / grader."""

from __future__ import annotations

import re
import sys
import types
from typing import Any

from agentrft.graders import Grader, Sample, Score
from agentrft.samplers.base import SamplingParams
from agentrft.types import (
    Cost,
    EnvRef,
    FinalAnswerEvent,
    Grade,
    Message,
    ModelCallEvent,
    Run,
    Task,
    ToolCallEvent,
    Trajectory,
)


def make_task(
    task_id: str,
    answer: float,
    *,
    level: int = 1,
    template: str = "change",
    program: str = "subtract(5, 3)",
    prompt: str | None = None,
) -> Task:
    return Task(
        id=task_id,
        env="fake",
        messages=[Message(role="user", content=prompt or f"Question {task_id}: 5 and 3?")],
        data={
            "answer": answer,
            "program": program,
            "level": level,
            "template": template,
            "company": "ACME",
            "year": 2019,
            "doc_ids": ["ACME-2019"],
        },
    )


def make_traj(
    task_id: str,
    reward: float,
    *,
    run_id: str = "r1",
    answer: str = "2",
    tools: int = 1,
    tool_error: bool = False,
    prompt_tokens: int = 100,
    completion_tokens: int = 20,
    seconds: float = 2.0,
    graded: bool = True,
    group_id: str | None = None,
) -> Trajectory:
    events: list[Any] = [ModelCallEvent(turn=0, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)]
    msgs = [Message(role="system", content="sys"), Message(role="user", content=f"Question {task_id}: 5 and 3?")]
    for i in range(tools):
        err = tool_error and i == 0
        events.append(
            ToolCallEvent(
                turn=i,
                call_id=f"c{i}",
                name="open",
                arguments={"doc_id": "ACME-2019"},
                result=None if err else "doc text <b>",
                error="boom" if err else None,
                error_kind="exception" if err else None,
            )
        )
        msgs.append(
            Message(
                role="assistant",
                content=None,
                tool_calls=[
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "open", "arguments": '{"doc_id": "ACME-2019"}'},
                    }
                ],
            )
        )
        msgs.append(Message(role="tool", tool_call_id=f"c{i}", content="boom" if err else "doc text <b>"))
    events.append(FinalAnswerEvent(turn=tools, text=answer))
    msgs.append(Message(role="assistant", content=answer))
    grade = (
        Grade(
            reward=reward,
            success=reward >= 1.0,
            grader="answer",
            cost=Cost(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
        )
        if graded
        else None
    )
    return Trajectory(
        run_id=run_id,
        task_id=task_id,
        group_id=group_id or f"{run_id}-{task_id}",
        env=EnvRef(name="fake"),
        policy="fake-policy",
        messages=msgs,
        events=events,
        grade=grade,
        created_at=1000.0,
        finished_at=1000.0 + seconds,
    )


class FakeStore:
    """In-memory stand-in for agentrft.store.Store (only what eval uses)."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.trajs: list[Trajectory] = []
        self.metrics: dict[str, list[dict[str, Any]]] = {}

    def add_run(self, run: Run) -> str:
        assert run.id not in self.runs
        self.runs[run.id] = run
        return run.id

    def update_run(self, run: Run) -> None:
        assert run.id in self.runs
        self.runs[run.id] = run

    def get_run(self, run_id: str) -> Run:
        return self.runs[run_id]

    def list_runs(self) -> list[Run]:
        return sorted(self.runs.values(), key=lambda r: (r.created_at, r.id))

    def add_trajectory(self, traj: Trajectory) -> str:
        self.trajs.append(traj)
        return traj.id

    def query_trajectories(
        self, *, run_id: str | None = None, task_id: str | None = None, **_: Any
    ) -> list[Trajectory]:
        return [
            t
            for t in self.trajs
            if (run_id is None or t.run_id == run_id) and (task_id is None or t.task_id == task_id)
        ]

    def log_metrics(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        self.metrics.setdefault(run_id, []).append({"step": step, **metrics})

    def get_metrics(self, run_id: str) -> list[dict[str, Any]]:
        return self.metrics.get(run_id, [])


def numeric_grade(text: str | None, answer: Any) -> Grade:
    nums = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    ok = bool(nums) and abs(float(nums[-1]) - float(answer)) < 1e-6
    return Grade(reward=1.0 if ok else 0.0, success=ok, grader="answer")


class FakeGrader(Grader):
    """The last number of the final answer against ``item["answer"]``."""

    type = "fake_numeric"

    def __init__(self) -> None:
        super().__init__("answer")

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        return Score(numeric_grade(sample.output_text, item["answer"]).reward)


def install_fake_graders(monkeypatch: Any) -> None:
    """Every grader spec loads as `FakeGrader` (a real `Grader`, graded through the one grading path)."""
    monkeypatch.setattr("agentrft.graders.load_grader", lambda spec: FakeGrader())


class FakeEnv:
    name = "fake"

    def __init__(self, tasks: list[Task]) -> None:
        self._tasks = tasks

    def tasks(self, split: str = "train") -> list[Task]:
        return self._tasks

    def grader_spec(self) -> dict[str, Any]:
        return {"type": "numeric", "name": "answer"}


class FakeSampler:
    """Answers each task with a scripted list of answers, one per sample."""

    policy = "fake-policy"
    policy_version = 0

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers


def install_fake_runner(monkeypatch: Any) -> None:
    class Runner:
        def __init__(
            self,
            env: Any,
            sampler: FakeSampler,
            *,
            store: Any,
            grader: Any,
            params: Any,
            tool_format: str = "xml",
            progress: bool = True,
            player: Any = None,
            seed: int | None = None,
        ) -> None:
            assert player is None  # these fakes play the built-in loop's episodes
            self.env, self.sampler, self.store = env, sampler, store
            self.params = params or SamplingParams()

        async def run(self, tasks: list[Task], samples_per_task: int, *, run_id: str) -> list[Trajectory]:
            out = []
            for task in tasks:
                for i in range(samples_per_task):
                    ans = self.sampler.answers[task.id][i]
                    t = make_traj(task.id, 0.0, run_id=run_id, answer=ans)
                    t = t.model_copy(update={"grade": numeric_grade(ans, task.data["answer"])})
                    if self.store is not None:
                        self.store.add_trajectory(t)
                    out.append(t)
            return out

    import agentrft.rollout  # noqa: F401  the package's own import of the real runner first (else it gets the fake)

    mod = types.ModuleType("agentrft.rollout.runner")
    mod.Runner = Runner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agentrft.rollout.runner", mod)
