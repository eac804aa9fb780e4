"""Everything a job's files must satisfy, checked before anything loads (no torch, no model).

As the hosted services do, and more, one `Problem` per fault, each naming the file, the line and
the field:

* each file: readable UTF-8, not empty, every non-blank line a JSON object (`inputs`);
* each row: ``messages`` a well-formed chat whose last message is from the user, ``tools`` valid
  OpenAI function schemas (`openai_rows`), an ``id``, if any, unique in its file (`envs.jsonl.parse_row`);
  ``messages`` and ``tools`` are reserved, every other key is grading data (the grader's ``item``);
* the grader: a valid spec of a known type (`graders.load_grader`: bad fields, a bad formula, a
  python grader whose source defines no ``grade``, ...), and every template variable it reads
  resolvable: ``{{ item.x.y[0] }}`` present and not null in every row of both files,
  ``{{ sample.F... }}`` naming a field a sample has (`SAMPLE_FIELDS`);
* tools: the module imports, each endpoint names a tool some row declares, no tool has both.

`validate_job` returns a `Report` (problems, row counts, notes); nothing is written.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrft.envs.jsonl import JsonlDataError, load_tools_module, parse_row
from agentrft.graders import Grader, GraderSpecError, LoadOptions, load_grader
from agentrft.graders.template import Template
from agentrft.inputs import InputError, read_text
from agentrft.rft.spec import JobSpec
from agentrft.types import Task

SAMPLE_FIELDS = ("output_text", "output_json", "output_tools", "choices", "trajectory")
GRADER_FIELD = "method.reinforcement.grader"
MAX_PROBLEMS = 200  # past this the files are clearly the wrong ones; say how many more and stop collecting


@dataclass
class Problem:
    """One fault: where (``FILE``, ``FILE:LINE`` or the job source) and what (field and reason)."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    more: int = 0  # problems found past MAX_PROBLEMS
    train_rows: int = 0
    valid_rows: int = 0
    tools_declared: list[str] = field(default_factory=list)
    tools_implemented: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, where: str, message: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(where, message))
        else:
            self.more += 1


def read_rows(path: str | Path, report: Report) -> list[tuple[int, Task]]:
    """(line, task) of every row that parses; each bad row is one problem."""
    try:
        lines = read_text(path).splitlines()
    except InputError as exc:
        report.add(str(path), str(exc).removeprefix(f"{path}: "))
        return []
    rows: list[tuple[int, Task]] = []
    first_line: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            task = parse_row(line, where)
        except JsonlDataError as exc:
            report.add(where, str(exc).removeprefix(f"{where}: "))
            continue
        if task.id in first_line:
            if "id" in task.data:
                report.add(where, f"field 'id': {task.id!r} is already the id of line {first_line[task.id]}")
            else:  # a row without an id is named by its content
                report.add(where, f"the same row as line {first_line[task.id]} (give rows an 'id' to repeat them)")
            continue
        first_line.setdefault(task.id, n)
        rows.append((n, task))
    if not lines or not any(line.strip() for line in lines):
        report.add(str(path), "empty file (expected one RFT row per line)")
    return rows


def grader_templates(grader: Grader, prefix: str = "") -> Iterator[tuple[str, Template]]:
    """(field path in the spec, compiled template) of every template a grader renders, sub-graders included."""
    parts = getattr(grader, "parts", None)
    if isinstance(parts, dict):
        for key, sub in parts.items():
            if isinstance(sub, Grader):
                yield from grader_templates(sub, f"{prefix}graders.{key}.")
    for name, value in vars(grader).items():
        if name != "parts":
            yield from _templates_in(value, f"{prefix}{name}", depth=0)


def _templates_in(value: Any, label: str, depth: int) -> Iterator[tuple[str, Template]]:
    if isinstance(value, Template):
        yield label, value
    elif depth < 4 and isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _templates_in(v, f"{label}[{i}]" if not isinstance(v, Template) else label, depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for k, v in value.items():
            yield from _templates_in(v, f"{label}.{k}", depth + 1)


def _variables(templates: list[tuple[str, Template]]) -> list[tuple[str, str, tuple[str | int, ...], str]]:
    """(spec field, namespace, path, as written) of every variable, each distinct one once."""
    seen: set[tuple[str, tuple[str | int, ...]]] = set()
    out = []
    for where, t in templates:
        for part in t.parts:
            if isinstance(part, str):
                continue
            ns, path, label = part
            if (ns, path) not in seen:
                seen.add((ns, path))
                out.append((where, ns, path, label))
    return out


def _present(data: Any, path: tuple[str | int, ...]) -> bool:
    """Whether the grader's template lookup finds a non-null value at ``path`` (its rules: `graders.template`)."""
    cur = data
    for seg in path:
        if isinstance(seg, int):
            if not isinstance(cur, list) or not -len(cur) <= seg < len(cur):
                return False
            cur = cur[seg]
        elif isinstance(cur, dict):
            cur = cur.get(seg)
        else:
            return False
        if cur is None:
            return False
    return True


def _dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def check_grader(spec: JobSpec, source: str, report: Report) -> Grader | None:
    """The grader built from the spec, or None after adding the problem (spec errors name the JSON path)."""
    try:
        return load_grader(spec.grader, LoadOptions())
    except GraderSpecError as exc:
        at = f"{GRADER_FIELD}.{exc.path}" if exc.path else GRADER_FIELD
        hint = " (or agentrft.grader_base_url in the job)" if exc.path.endswith("base_url") else ""
        report.add(source, f"field '{at}': {exc.message}{hint}")
    except InputError as exc:
        report.add(source, f"field '{GRADER_FIELD}': {exc}")
    return None


def checkable_graders(spec: JobSpec, grader: Grader | None) -> list[tuple[str, Grader]]:
    """(field prefix, grader) whose templates can be checked: the grader, or when a multi grader does not
    load, each of its sub-graders that does (so one bad sub-grader does not hide the rows' problems)."""
    if grader is not None:
        return [("", grader)]
    subs = spec.grader.get("graders") if spec.grader.get("type") == "multi" else None
    out: list[tuple[str, Grader]] = []
    for key, sub in (subs if isinstance(subs, dict) else {}).items():
        if isinstance(sub, dict) and sub.get("type") != "multi":
            try:
                out.append((f"graders.{key}.", load_grader(sub, LoadOptions())))
            except InputError:
                continue  # reported with the whole grader
    return out


def check_variables(
    graders: list[tuple[str, Grader]], files: list[tuple[str, list[tuple[int, Task]]]], source: str, report: Report
) -> None:
    """Every ``sample.`` variable names a sample field; every ``item.`` variable is found in every row."""
    templates = [t for prefix, g in graders for t in grader_templates(g, prefix)]
    for where, ns, path, label in _variables(templates):
        at = f"{GRADER_FIELD}.{where}"
        if ns == "sample":
            if not path or path[0] not in SAMPLE_FIELDS:
                report.add(
                    source,
                    f"field '{at}': {{{{ {label} }}}}: a sample has {', '.join(SAMPLE_FIELDS)}",
                )
            continue
        if not path:
            report.add(source, f"field '{at}': {{{{ {label} }}}} names the whole row; name one of its fields")
            continue
        for name, rows in files:
            for line, task in rows:
                if not _present(task.data, path):
                    reserved = path[0] in ("messages", "tools")
                    why = (
                        "is reserved for the prompt and not part of the grader's item"
                        if reserved
                        else "is missing or null"
                    )
                    report.add(
                        f"{name}:{line}",
                        f"field '{_dotted(path)}': {why}, but the grader reads {{{{ {label} }}}} ({at})",
                    )


def check_tools(spec: JobSpec, source: str, declared: list[str], report: Report) -> list[str]:
    """The declared tools that something implements; problems for a module that fails or a stray endpoint."""
    local = spec.agentrft
    implemented: set[str] = set()
    if local.tools_module:
        try:
            module = load_tools_module(local.tools_module)
        except JsonlDataError as exc:
            report.add(source, f"field 'agentrft.tools_module': {exc}")
        else:
            implemented = {name for name in declared if callable(getattr(module, name, None))}
    for name in local.tool_endpoints:
        if name not in declared:
            report.add(source, f"field 'agentrft.tool_endpoints.{name}': no row declares a tool named {name!r}")
        elif name in implemented:
            report.add(
                source,
                f"field 'agentrft.tool_endpoints.{name}': the tools module implements {name!r} too; keep one",
            )
        else:
            implemented.add(name)
    return sorted(implemented)


def validate_job(spec: JobSpec, source: str) -> Report:
    """All the problems of a job's files, grader and tools (``source``: the job file, or ``flags``)."""
    report = Report()
    train = read_rows(spec.training_file, report)
    valid = read_rows(spec.validation_file, report)
    report.train_rows, report.valid_rows = len(train), len(valid)
    graders = checkable_graders(spec, check_grader(spec, source, report))
    check_variables(graders, [(spec.training_file, train), (spec.validation_file, valid)], source, report)
    declared = sorted({s["function"]["name"] for _, t in [*train, *valid] for s in t.tools or []})
    report.tools_declared = declared
    report.tools_implemented = check_tools(spec, source, declared, report)
    idle = [t for t in declared if t not in report.tools_implemented]
    if idle:
        report.notes.append(
            f"tools declared but not implemented here: {', '.join(idle)} (a call answers with an error; the "
            "grader still sees it in sample.output_tools). Implement them with agentrft.tools_module or "
            "agentrft.tool_endpoints"
        )
    order = {source: 0, spec.training_file: 1, spec.validation_file: 2}

    def position(problem: Problem) -> tuple[int, int]:
        file, _, line = problem.where.rpartition(":")
        if line.isdigit() and file in order:
            return order[file], int(line)
        return order.get(problem.where, 3), 0

    report.problems.sort(key=position)  # the job's own problems, then each file's in line order
    effort = spec.hyperparameters.reasoning_effort
    if effort != "default":
        report.notes.append(f"reasoning_effort={effort!r} is not applicable: {spec.model} has no reasoning mode")
    return report
