"""A seeded corpus of bad file inputs for the CLI, and a harness that runs one case in process.

Each `Case` is one command (`grade`, `traj import`, `traj import --chat-logs`, `train`,
`eval --env jsonl:…`, `finqa evaluate`, `dpo --pairs`) with one of its input files made bad: empty,
binary, UTF-16, Latin-1, lone surrogates, deep nesting, NaN/Infinity, huge numbers,
values of the wrong type at a random place (seeded), and a few targeted shapes. All other
input files of the command are valid. `run_case` runs it through typer's CliRunner with
the model loaders replaced by a stub that raises `ReachedModel`: a case that gets that far
was accepted as input, and nothing heavy ever loads.

Used by `test_cli_bad_input_fuzz.py` (asserts the rules: exit 2, one line on stderr, no
traceback, nothing half-written) and by `benchmarks/bad_input_tracebacks.py` (counts
tracebacks, also against an older checkout: it only needs `agentrft.cli.main.app`).
"""

from __future__ import annotations

import json
import random
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# ---------------------------------------------------------------- valid inputs

GRADER = {
    "type": "multi",
    "calculate_output": "0.5 * acc + 0.5 * exact",
    "graders": {
        "acc": {"type": "numeric", "reference": "{{ item.answer }}"},
        "exact": {
            "type": "string_check",
            "input": "{{ sample.output_text }}",
            "reference": "{{ item.answer }}",
            "operation": "eq",
        },
    },
}
ITEM = {"answer": "4", "id": "q1"}
SAMPLE = {"output_text": "4"}
TRAJECTORY = {
    "id": "01JABCDEFGHJKMNPQRSTVWXYZ0",
    "run_id": "r1",
    "task_id": "t1",
    "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    "events": [{"type": "final_answer", "turn": 0, "text": "4", "t": 1.0}],
    "grade": {"reward": 1.0, "success": True},
    "created_at": 1.0,
    "metadata": {"source": "corpus"},
}
CHAT = {
    "model": "gpt-x",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4"},
    ],
}
TRAIN = {
    "seed": 0,
    "steps": 1,
    "policy": {"name": "tiny", "finetune": "full"},
    "rollout": {"env": "finqa-lite:1", "tasks_per_step": 1, "group_size": 2, "max_tokens": 8},
    "optimizer": {"lr": 1e-5},
    "checkpoint": {"every_steps": 0},
    "logging": {"tensorboard": False},
}
ROW = {
    "id": "t1",
    "messages": [{"role": "user", "content": "What is 2+2? Use the tool."}],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "calc",
                "description": "Evaluate an expression.",
                "parameters": {"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]},
            },
        }
    ],
    "answer": "4",
}
_TABLE = [["", "2019", "2018"], ["net revenue", "$ 1,200", "$ 1,000"]]
GOLD = [
    {
        "id": "a",
        "pre_text": ["revenue grew ."],
        "post_text": [],
        "table": _TABLE,
        "qa": {"question": "change?", "program": "subtract(1200, 1000)", "exe_ans": 200.0},
    }
]
PREDICTIONS = [{"id": "a", "predicted": ["subtract(", "1200", "1000", ")", "EOF"]}]
PAIR = {
    "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    "chosen": [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "4"},
    ],
    "rejected": [{"role": "assistant", "content": "5"}],
    "task_id": "t1",
    "chosen_reward": 1.0,
}


@dataclass(frozen=True)
class Slot:
    """One input file of one command: its format and a valid content."""

    command: str
    fmt: str  # json | jsonl | yaml | toml
    valid: Any  # the object (json/yaml/toml) or the list of row objects (jsonl)
    hole: tuple[Any, ...] | None = None  # where bad values go (in the first row): a free-form field, else a string


SLOTS: dict[str, Slot] = {
    "grade.grader": Slot("grade", "json", GRADER),
    "grade.grader-yaml": Slot("grade", "yaml", GRADER),
    "grade.items": Slot("grade", "jsonl", [ITEM], ("answer",)),
    "grade.samples": Slot("grade", "jsonl", [SAMPLE], ("output_json",)),
    "traj.jsonl": Slot("traj", "jsonl", [TRAJECTORY], ("metadata", "source")),
    "traj.chat": Slot("traj-chat", "jsonl", [CHAT], ("score",)),
    "train.yaml": Slot("train", "yaml", TRAIN),
    "train.toml": Slot("train", "toml", TRAIN),
    "eval.rows": Slot("eval", "jsonl", [ROW], ("answer",)),
    "finqa.predictions": Slot("finqa", "json", PREDICTIONS),
    "finqa.gold": Slot("finqa", "json", GOLD, (0, "extra")),
    "dpo.pairs": Slot("dpo", "jsonl", [PAIR], ("meta",)),
}

# ---------------------------------------------------------------- serialisation

_HOLE = "__BAD_VALUE_HERE__"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if v is None:
        return '""'  # TOML has no null; the nearest wrong value
    raise TypeError(type(v))


def _toml(obj: dict[str, Any]) -> str:
    head = [f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in obj.items() if not isinstance(v, dict)]
    body = []
    for k, v in obj.items():
        if isinstance(v, dict):
            body.append(f"\n[{json.dumps(str(k))}]")
            body += [f"{json.dumps(str(kk))} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(head + body) + "\n"


def serialise(fmt: str, obj: Any) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=1)
    if fmt == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in obj)
    if fmt == "yaml":
        return yaml.safe_dump(obj, sort_keys=False, allow_unicode=True)
    if fmt == "toml":
        return _toml(obj)
    raise ValueError(fmt)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in `obj` a value could be replaced (containers and leaves, not the root)."""
    items: Any = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _replace(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy: Any = dict(obj) if isinstance(obj, dict) else list(obj)
    copy[path[0]] = _replace(obj.get(path[0]) if isinstance(obj, dict) else obj[path[0]], path[1:], value)
    return copy


def _delete(obj: Any, path: tuple[Any, ...]) -> Any:
    if len(path) == 1:
        copy: Any = dict(obj) if isinstance(obj, dict) else list(obj)
        del copy[path[0]]
        return copy
    return _replace(obj, path[:1], _delete(obj[path[0]], path[1:]))


def _first_string_path(obj: Any) -> tuple[Any, ...]:
    for path in _paths(obj):
        value = obj
        for key in path:
            value = value[key]
        if isinstance(value, str):
            return path
    raise ValueError("no string in the valid object")


# Raw bad values written in place of one value, per format.
_RAW: dict[str, dict[str, str]] = {
    "json": {
        "nan": "NaN",
        "infinity": "-Infinity",
        "overflow-float": "1e999",
        "huge-int": str(10**30),
        "huge-digits": "9" * 5000,
        "lone-surrogate": '"ok \\ud800 not ok"',
        "lone-low-surrogate": '"\\udfff"',
        "deep-list": "[" * 3000 + "]" * 3000,
        "deep-object": '{"a": ' * 3000 + "1" + "}" * 3000,
        "deep-unclosed": "[" * 100_000,
    },
    "yaml": {
        "nan": ".nan",
        "infinity": "-.inf",
        "huge-int": str(10**30),
        "lone-surrogate": '"ok \\ud800 not ok"',
        "deep-list": "[" * 3000 + "]" * 3000,
        "deep-unclosed": "[" * 100_000,
        "alias-bomb": "null",  # replaced below by a document of its own
    },
    "toml": {
        "nan": "nan",
        "infinity": "-inf",
        "huge-int": str(10**30),
        "lone-surrogate": '"\\ud800"',
        "deep-list": "[" * 3000 + "]" * 3000,
        "deep-unclosed": "[" * 100_000,
    },
}

_ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
)

_WRONG_VALUES: list[Any] = [None, True, False, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}, [[]], "9" * 300]


@dataclass(frozen=True)
class Case:
    """One bad input: `slot` gets `content`; `expect` is 2 (must be refused) or None (accepted or refused)."""

    slot: str
    kind: str
    content: bytes
    expect: int | None = 2
    argv: tuple[str, ...] = ()  # extra arguments after the command's own

    @property
    def name(self) -> str:
        return f"{self.slot}/{self.kind}"

    @property
    def command(self) -> str:
        return SLOTS[self.slot].command


def _cases_for(slot_name: str, slot: Slot, rng: random.Random, n_random: int) -> list[Case]:
    fmt, valid = slot.fmt, slot.valid
    text = serialise(fmt, valid)
    rows = valid if fmt == "jsonl" else None
    base = rows[0] if rows is not None else valid
    out = [
        Case(slot_name, "empty", b""),
        Case(slot_name, "blank", b"\n  \n\t\n"),
        Case(slot_name, "binary", bytes(rng.randrange(256) for _ in range(512))),
        Case(slot_name, "nul-bytes", text.encode()[:20] + b"\x00\x00" + text.encode()[20:]),
        Case(slot_name, "utf16", text.encode("utf-16")),
        Case(slot_name, "utf16-no-bom", text.encode("utf-16-le")),
        Case(slot_name, "latin1", text.replace(_first_str(base), "caf\u00e9", 1).encode("latin-1", "replace")),
        Case(slot_name, "truncated", text.encode()[: len(text) // 2]),
        Case(slot_name, "top-level-list" if fmt != "jsonl" else "row-is-list", _dump(fmt, [1, 2], rows)),
        Case(slot_name, "top-level-string" if fmt != "jsonl" else "row-is-string", _dump(fmt, "x", rows)),
    ]
    if fmt == "jsonl":
        out.append(
            Case(
                slot_name, "huge-line", (json.dumps(base)[:-1] + ', "pad": "' + "x" * 2_000_000 + '"}\n').encode(), None
            )
        )
    where = slot.hole or _first_string_path(base)
    for kind, raw in _RAW.get("json" if fmt == "jsonl" else fmt, {}).items():
        if kind == "alias-bomb":
            content = (_ALIAS_BOMB + text).encode()
        else:
            holed = serialise(fmt, _replace(valid, (0, *where) if rows is not None else where, _HOLE))
            marker = {"json": json.dumps(_HOLE), "jsonl": json.dumps(_HOLE), "yaml": _HOLE, "toml": json.dumps(_HOLE)}
            content = holed.replace(marker[fmt], raw, 1).encode("utf-8", "surrogatepass")
        out.append(Case(slot_name, kind, content))
    paths = list(_paths(base))
    for k in range(n_random):
        path = rng.choice(paths)
        if rng.random() < 0.2:
            mutated, kind = _delete(base, path), f"random-{k}-delete-{_show(path)}"
        else:
            value = rng.choice(_WRONG_VALUES)
            mutated, kind = _replace(base, path, value), f"random-{k}-{_show(path)}={_short(value)}"
        if fmt == "toml" and _has_none(mutated):
            continue
        out.append(Case(slot_name, kind, serialise(fmt, [mutated] if rows is not None else mutated).encode(), None))
    return out


def _first_str(obj: Any) -> str:
    value = obj
    for key in _first_string_path(obj):
        value = value[key]
    return json.dumps(value)[1:-1]


def _dump(fmt: str, value: Any, rows: list[Any] | None) -> bytes:
    if fmt == "toml":
        return b"= 1\n" if isinstance(value, list) else b'"x"\n'  # TOML has no non-table top level
    return serialise("jsonl" if rows is not None else fmt, [value] if rows is not None else value).encode()


def _has_none(obj: Any) -> bool:
    if obj is None:
        return True
    if isinstance(obj, dict):
        return any(_has_none(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_none(v) for v in obj)
    return False


def _show(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 12 else text[:9] + "..."


# Targeted shapes: each is refused (exit 2) from now on.
def _targeted() -> list[Case]:
    def jl(*rows: Any) -> bytes:
        return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()

    user = {"role": "user", "content": "hi"}
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{}"}}
    bad_tool_rows = [
        {**ROW, "tools": [{"type": "function", "function": {"name": "calc", "parameters": 5}}]},
        {**ROW, "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"properties": []}}}]},
        {**ROW, "tools": [{"type": "function", "function": {"name": "calc", "description": 7}}]},
        {**ROW, "tools": [{"type": "function", "function": {"name": "calc", "parameters": {"type": "objekt"}}}]},
        {**ROW, "tools": [{"function": {"name": "calc"}}, {"function": {"name": "calc"}}]},
        {**ROW, "tools": ["calc"]},
    ]
    chats = {
        "no-messages": {"messages": []},
        "tool-without-id": {"messages": [user, {"role": "tool", "content": "4"}]},
        "tool-unknown-id": {
            "messages": [
                user,
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "zz", "content": "4"},
            ]
        },
        "null-user-content": {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "4"}]},
        "assistant-empty": {"messages": [user, {"role": "assistant"}]},
        "nan-in-metadata": '{"messages": [{"role": "user", "content": "hi"}], "score": NaN}',
        "content-part-not-object": {"messages": [{"role": "user", "content": ["hi"]}]},
    }
    out = [Case("traj.chat", f"targeted-{k}", jl(v)) for k, v in chats.items()]
    out += [Case("eval.rows", f"targeted-bad-tool-{i}", jl(r)) for i, r in enumerate(bad_tool_rows)]
    out += [
        Case("eval.rows", "targeted-duplicate-id", jl(ROW, ROW)),
        Case("eval.rows", "targeted-no-messages", jl({**ROW, "messages": []})),
        Case("eval.rows", "targeted-null-user-content", jl({**ROW, "messages": [{"role": "user", "content": None}]})),
        Case("grade.samples", "targeted-chat-no-messages", jl({"messages": []})),
        Case("grade.samples", "targeted-nan", b'{"output_text": "4", "output_json": NaN}\n'),
        Case("grade.grader", "targeted-deep-formula", json.dumps({**GRADER, "calculate_output": "(" * 5000 + "acc" + ")" * 5000}).encode()),
        Case("grade.grader", "targeted-long-formula", json.dumps({**GRADER, "calculate_output": "+".join(["acc"] * 20000)}).encode()),
        Case("train.yaml", "targeted-seed-huge", serialise("yaml", {**TRAIN, "seed": 10**30}).encode()),
        Case("train.yaml", "targeted-seed-2**64", serialise("yaml", {**TRAIN, "seed": 2**64}).encode()),
        Case("train.yaml", "targeted-seed-negative", serialise("yaml", {**TRAIN, "seed": -1}).encode()),
        Case("train.yaml", "targeted-unknown-env", serialise("yaml", _replace(TRAIN, ("rollout", "env"), "nope:1")).encode()),
        Case("train.yaml", "targeted-unknown-policy", serialise("yaml", _replace(TRAIN, ("policy", "name"), "gpt-9")).encode()),
        Case("train.yaml", "targeted-bad-grader", serialise("yaml", _replace(TRAIN, ("rollout", "grader"), {"type": "nope"})).encode()),
        Case("train.yaml", "targeted-bad-tool-format", serialise("yaml", _replace(TRAIN, ("rollout", "tool_format"), "json")).encode()),
        Case("train.yaml", "targeted-comments-only", b"# nothing here\n"),
        Case("train.yaml", "targeted-set-seed-huge", serialise("yaml", TRAIN).encode(), argv=("--set", f"seed={10**30}")),
        Case("train.yaml", "targeted-set-nan", serialise("yaml", TRAIN).encode(), argv=("--set", "optimizer.lr=.nan")),
        Case("train.yaml", "targeted-set-deep", serialise("yaml", TRAIN).encode(), argv=("--set", "rollout.grader=" + "[" * 5000)),
        Case("eval.rows", "targeted-surrogate-in-prompt", b'{"id": "t1", "messages": [{"role": "user", "content": "2+2 \\ud800?"}], "answer": "4"}\n'),
        Case("finqa.predictions", "targeted-empty-list", b"[]"),
        Case("finqa.gold", "targeted-empty-list", b"[]"),
    ]  # fmt: skip
    return out


def corpus(seed: int = 13, n_random: int = 10) -> list[Case]:
    """Every case, deterministic for a seed: generic mutations of each slot, `n_random` seeded
    wrong-type mutations per slot, and the targeted shapes."""
    rng = random.Random(seed)
    cases: list[Case] = []
    for name, slot in SLOTS.items():
        cases += _cases_for(name, slot, rng, n_random)
    return cases + _targeted()


# ---------------------------------------------------------------- running a case


class ReachedModel(BaseException):
    """Raised by the stubbed model loaders: the input was accepted."""


@dataclass
class Outcome:
    exit_code: int | None  # None when the model loader was reached
    stdout: str
    stderr: str
    traceback: str | None  # the uncaught exception's traceback, if any
    violations: list[str]  # side effects a refused input must not have (run dir made, store changed)

    @property
    def reached_model(self) -> bool:
        return self.exit_code is None

    @property
    def exception_type(self) -> str | None:
        if not self.traceback:
            return None
        for line in reversed(self.traceback.splitlines()):
            m = re.match(r"^([\w.]+(Error|Exception|Warning))\b", line)
            if m:
                return m.group(1)
        return "?"


def _stub(*args: Any, **kwargs: Any) -> Any:
    raise ReachedModel()


def _store_state(db: Path) -> tuple[int, list[str]]:
    from agentrft.store import Store

    with Store(db) as store:
        return store.count_trajectories(), sorted(r.id for r in store.list_runs())


def run_case(
    case: Case,
    tmp: Path,
    invoke: Callable[[list[str]], Any],
    patch: Callable[[Any, str, Any], None],
    *,
    real_eval_policy: bool = False,
) -> Outcome:
    """Write the case's files under `tmp`, run its command, report what happened.

    `invoke(argv)` runs the CLI (a CliRunner result); `patch(obj, name, value)` sets an attribute
    for the duration of the case (pytest's monkeypatch.setattr, or a plain setattr with undo).
    `real_eval_policy`: `eval` loads the real `tiny` policy and runs (what a user would see
    past the input checks) instead of stopping at the loader.
    """
    import agentrft.samplers.policies as policies

    if not (real_eval_policy and SLOTS[case.slot].command == "eval"):
        patch(policies, "load_policy", _stub)
        patch(policies, "load_trainable_policy", _stub)

    slot = SLOTS[case.slot]
    files: dict[str, Path] = {}
    for name, other in SLOTS.items():
        if other.command != slot.command:
            continue
        suffix = {"json": ".json", "jsonl": ".jsonl", "yaml": ".yaml", "toml": ".toml"}[other.fmt]
        path = tmp / f"{name.replace('.', '-')}{suffix}"
        path.write_bytes(case.content if name == case.slot else serialise(other.fmt, other.valid).encode())
        files[name] = path
    violations: list[str] = []
    db = tmp / "store.db"
    run_dir = tmp / "run"
    before = None
    if slot.command == "grade":
        grader = files["grade.grader"] if case.slot != "grade.grader-yaml" else files["grade.grader-yaml"]
        argv = ["grade", "--grader", str(grader), "--items", str(files["grade.items"])]
        argv += ["--samples", str(files["grade.samples"]), "--json"]
    elif slot.command in ("traj", "traj-chat"):
        from agentrft.store import Store
        from agentrft.types import Trajectory

        with Store(db) as store:
            store.add_trajectory(Trajectory.model_validate({**TRAJECTORY, "id": "01JZZZZZZZZZZZZZZZZZZZZZZZ"}))
        before = _store_state(db)
        argv = ["traj", "import", str(files[case.slot]), "--db", str(db)]
        if slot.command == "traj-chat":
            argv += ["--chat-logs", "--run", "logs"]
    elif slot.command == "train":
        argv = ["train", str(files[case.slot]), "--set", "steps=1", "--run-dir", str(run_dir), "--json"]
    elif slot.command == "eval":
        argv = ["eval", "--env", f"jsonl:{files['eval.rows']}", "--policy", "tiny", "--db", str(db)]
        argv += ["--samples", "1", "--tasks", "1", "--json"]
    elif slot.command == "finqa":
        argv = ["finqa", "evaluate", str(files["finqa.predictions"]), str(files["finqa.gold"]), "--json"]
    elif slot.command == "dpo":
        argv = ["dpo", "--pairs", str(files["dpo.pairs"]), "--policy", "tiny", "--set", "steps=1"]
        argv += ["--run-dir", str(run_dir), "--json"]
    else:
        raise ValueError(slot.command)

    try:
        result = invoke([*argv, *case.argv])
    except ReachedModel:
        return Outcome(None, "", "", None, [])
    tb = None
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else repr(result.exception)
    elif "Traceback (most recent call last)" in result.stdout + result.stderr:  # printed, e.g. by a thread
        tb = result.stderr if "Traceback" in result.stderr else result.stdout
    if result.exit_code not in (0, None):
        if slot.command in ("train", "dpo") and run_dir.exists():
            violations.append(f"run dir created: {sorted(p.name for p in run_dir.iterdir())}")
        if before is not None and _store_state(db) != before:
            violations.append("store modified")
        if slot.command == "eval" and db.exists():
            violations.append("eval store created")
    return Outcome(result.exit_code, result.stdout, result.stderr, tb, violations)
