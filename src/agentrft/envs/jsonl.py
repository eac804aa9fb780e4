"""`JsonlEnv`: tasks from an OpenAI RFT dataset (JSONL, one object per line).

Each row: `messages` (the last from the user), optional `tools` (OpenAI
function schemas); every other key is grading data and goes to `Task.data`.
Declared tools run only if something implements them: a Python module
(`tools_module`: a .py path or an importable module name, functions named
like the tools) or an HTTP endpoint per tool (`endpoints`: ``{name: URL or
{url, timeout_s, headers}}``, or a JSON file of that; see `tools/http_tool.py`);
otherwise a call returns an error ToolResult that says so, so an eval still
runs and the trajectory shows the attempt. Rows that bring their own
system/developer message keep it instead of the env's generic prompt.

Splits: with a validation file (`valid_path`, as an RFT job has) the split
``valid`` holds its rows and every other split the training file's; without
one every split is the training file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from pathlib import Path
from typing import Any

from agentrft.envs.base import Environment, EnvLimits
from agentrft.envs.plugins import EnvSpec
from agentrft.envs.toolbox_episode import ToolboxEpisode
from agentrft.inputs import InputError, parse_object, read_json, read_text
from agentrft.openai_rows import parse_messages, parse_tools
from agentrft.tools.base import ToolResult
from agentrft.tools.http_tool import HttpEndpoint, HttpTool, load_endpoints
from agentrft.tools.registry import CallableTool, Tool, Toolbox, error_result
from agentrft.types import Message, Task

VALID_SPLIT = "valid"
SYSTEM_PROMPT = (
    "You are a helpful assistant. Use the provided tools when they help; "
    "when you are done, reply with your final answer and no tool call."
)


class JsonlDataError(InputError):
    """A dataset or grader file could not be read; the message names file, line and field."""


def load_tools_module(spec: str) -> Any:
    """A tools module by .py path or importable name; JsonlDataError names it when it cannot load."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise JsonlDataError(f"{spec}: tools module file not found")
        mspec = importlib.util.spec_from_file_location(f"agentrft_user_tools_{path.stem}", path)
        if mspec is None or mspec.loader is None:
            raise JsonlDataError(f"{spec}: cannot load as a Python module")
        module = importlib.util.module_from_spec(mspec)
        try:
            mspec.loader.exec_module(module)
        except Exception as exc:  # the user's module: whatever it raises is a bad input, named in one line
            raise JsonlDataError(f"{spec}: the tools module failed to import: {type(exc).__name__}: {exc}") from None
        return module
    try:
        return importlib.import_module(spec)
    except Exception as exc:
        raise JsonlDataError(f"{spec}: the tools module failed to import: {type(exc).__name__}: {exc}") from None


def parse_row(line: str, where: str) -> Task:
    """One JSONL line as a Task; JsonlDataError names `where` (file:line) and the field."""
    try:
        row = parse_object(line, where)
        messages = parse_messages(row.get("messages"), where)
        tools = parse_tools(row["tools"], where) if row.get("tools") is not None else None
    except InputError as exc:
        raise JsonlDataError(str(exc)) from None
    if messages[-1].role != "user":
        raise JsonlDataError(
            f"{where}: field 'messages': the last message must be from the user, not {messages[-1].role!r}"
        )
    data = {k: v for k, v in row.items() if k not in ("messages", "tools")}
    row_id = row.get("id")
    if row_id is not None and (isinstance(row_id, bool) or not isinstance(row_id, str | int) or row_id == ""):
        raise JsonlDataError(f"{where}: field 'id': must be a non-empty string or an integer")
    task_id = str(row_id) if row_id is not None else "jsonl-" + hashlib.sha256(line.strip().encode()).hexdigest()[:16]
    return Task(id=task_id, env="jsonl", messages=messages, tools=tools, data=data)


def load_jsonl_tasks(path: str | Path) -> list[Task]:
    """The tasks of an RFT JSONL file; an empty file or two rows with one task id are refused."""
    try:
        lines = read_text(path).splitlines()
    except InputError as exc:
        raise JsonlDataError(str(exc)) from None
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        task = parse_row(line, f"{path}:{n}")
        if task.id in first_line:
            raise JsonlDataError(
                f"{path}:{n}: field 'id': task id {task.id!r} is already used on line {first_line[task.id]} "
                "(ids name tasks in results and stores; make them unique)"
            )
        first_line[task.id] = n
        tasks.append(task)
    if not tasks:
        raise JsonlDataError(f"{path}: empty file (expected one RFT row per line)")
    return tasks


class _DeclaredOnly(Toolbox):
    """Dispatch to local implementations; declared-but-unimplemented tools answer with an explanation."""

    def __init__(self, implemented: list[CallableTool], declared: list[str]):
        super().__init__(implemented)
        self.declared = declared

    async def call(self, name: str, arguments: dict[str, Any] | str | None) -> ToolResult:
        if name not in self.declared:
            return error_result(
                f"Error: unknown tool {name!r}. Available tools: {', '.join(self.declared) or 'none'}.", "unknown_tool"
            )
        if name not in self.tools:
            return error_result(
                f"Error: tool {name!r} is declared by the dataset but not executable locally "
                "(no Python tool module or HTTP endpoint implements it).",
                "unknown_tool",
            )
        return await super().call(name, arguments)


class JsonlEnv(Environment):
    name = "jsonl"
    version = "1"

    @classmethod
    def from_spec(cls, spec: EnvSpec, **kwargs: Any) -> JsonlEnv:
        """``jsonl:PATH[?grader=G.json&tools=MODULE&endpoints=E.json&valid=V.jsonl]``."""
        if not spec.arg:
            raise spec.error("jsonl needs a path, e.g. jsonl:data/train.jsonl")
        known = {"grader": "grader_spec_path", "tools": "tools_module", "endpoints": "endpoints", "valid": "valid_path"}
        for option, value in spec.known(*known).items():
            kwargs.setdefault(known[option], value)
        return cls(spec.arg, **kwargs)

    def __init__(
        self,
        path: str | Path,
        grader_spec_path: str | Path | None = None,
        *,
        tools_module: str | None = None,
        endpoints: dict[str, HttpEndpoint] | str | Path | None = None,
        valid_path: str | Path | None = None,
        limits: EnvLimits | None = None,
    ):
        self.path = Path(path)
        self._tasks = load_jsonl_tasks(self.path)
        self._valid = load_jsonl_tasks(valid_path) if valid_path is not None else None
        self.limits = limits or EnvLimits()
        self._grader = self._read_grader(grader_spec_path) if grader_spec_path else None
        schemas: dict[str, dict[str, Any]] = {}
        for t in [*self._tasks, *(self._valid or [])]:
            for s in t.tools or []:
                schemas.setdefault(s["function"]["name"], s)
        self._schemas = list(schemas.values())
        self._impl: dict[str, CallableTool] = {}
        if tools_module:
            module = load_tools_module(tools_module)
            for name in schemas:
                fn = getattr(module, name, None)
                if callable(fn):
                    self._impl[name] = Tool.from_function(fn, name=name, timeout_s=self.limits.tool_timeout_s)
        served = self._endpoints(endpoints)
        for name, endpoint in served.items():
            if name not in schemas:
                raise JsonlDataError(f"tool endpoint {name!r}: no row of {self.path} declares a tool of that name")
            if name in self._impl:
                raise JsonlDataError(
                    f"tool {name!r} has both a Python implementation ({tools_module}) and an HTTP endpoint; keep one"
                )
            self._impl[name] = HttpTool(schemas[name], endpoint)

    @staticmethod
    def _endpoints(value: dict[str, HttpEndpoint] | str | Path | None) -> dict[str, HttpEndpoint]:
        if not isinstance(value, str | Path):
            return dict(value or {})
        try:
            return load_endpoints(value)
        except InputError as exc:
            raise JsonlDataError(str(exc)) from None

    def implemented_tools(self) -> list[str]:
        """The declared tools that run (through the tools module or an endpoint)."""
        return sorted(self._impl)

    @staticmethod
    def _read_grader(path: str | Path) -> dict[str, Any]:
        try:
            spec = read_json(path)
        except InputError as exc:
            raise JsonlDataError(f"grader spec {exc}") from None
        if not isinstance(spec, dict) or "type" not in spec:
            raise JsonlDataError(f"{path}: a grader spec must be a JSON object with a 'type' field")
        return spec

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self._schemas)

    def tasks(self, split: str = "train") -> list[Task]:
        if split == VALID_SPLIT and self._valid is not None:
            return list(self._valid)
        return list(self._tasks)

    def grader_spec(self) -> dict[str, Any]:
        return dict(self._grader) if self._grader else super().grader_spec()

    def initial_messages(self, task: Task) -> list[Message]:
        if task.messages and task.messages[0].role in ("system", "developer"):
            return [*self.few_shot(), *task.messages]
        return super().initial_messages(task)

    def start(self, task: Task) -> ToolboxEpisode:
        declared = [s["function"]["name"] for s in task.tools or []]
        box = _DeclaredOnly([self._impl[n] for n in declared if n in self._impl], declared)
        return ToolboxEpisode(task, box, self.limits.max_tool_calls)
