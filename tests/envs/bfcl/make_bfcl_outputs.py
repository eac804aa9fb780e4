"""Writes bfcl_outputs.json: model outputs in the shape the benchmark's OpenAI function-calling handler records,
for BFCL tasks across categories: each task's ground truth as calls, and wrong variants of it (an argument
changed, a call dropped, a turn missing, a call where none should be, text where a call should be), plus the
outputs recorded from SmolLM2-135M episodes (`--from-db`). The equality test replays each through the agent
loop and compares agentrft's grade with the package's own verdict.

    .venv/bin/python tests/envs/bfcl/make_bfcl_outputs.py [--from-db runs/bfcl_base.db]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

from agentrft.envs.bfcl import package

OUT = Path(__file__).with_name("bfcl_outputs.json")
PER_CATEGORY = {
    "simple_python": 6,
    "multiple": 4,
    "parallel": 4,
    "parallel_multiple": 4,
    "irrelevance": 4,
    "multi_turn_base": 4,
    "multi_turn_miss_func": 3,
    "multi_turn_miss_param": 3,
    "multi_turn_long_context": 3,
}


PER_CATEGORY_RECORDED = 4  # recorded episodes kept per category


def _value(options: list[Any]) -> tuple[bool, Any]:
    for v in options:
        if v != "":
            return True, v
    return False, None


def single_truth_calls(truth: list[dict[str, Any]]) -> list[dict[str, str]]:
    calls = []
    for call in truth:
        ((name, params),) = call.items()
        args = {}
        for key, options in params.items():
            present, value = _value(options)
            if present:
                args[key] = value
        calls.append({name.replace(".", "_"): json.dumps(args)})
    return calls


def _method(entry: dict[str, Any], name: str) -> Any:
    mapping = package.bfcl().multi_turn.CLASS_FILE_PATH_MAPPING
    for cls_name in entry["involved_classes"]:
        cls = getattr(importlib.import_module(mapping[cls_name]), cls_name)
        if hasattr(cls, name):
            return getattr(cls, name)
    raise KeyError(name)


def parse_call(entry: dict[str, Any], text: str) -> dict[str, str]:
    call = ast.parse(text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    name = call.func.id
    params = [p for p in inspect.signature(_method(entry, name)).parameters if p != "self"]
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(call.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    return {name: json.dumps(args)}


def multi_truth(entry: dict[str, Any], truth: list[list[str]]) -> list[list[Any]]:
    return [[[parse_call(entry, c) for c in turn], "Done."] if turn else ["I cannot do that."] for turn in truth]


def _changed(call: dict[str, str]) -> dict[str, str]:
    ((name, raw),) = call.items()
    args = json.loads(raw)
    for key, value in args.items():
        if isinstance(value, str):
            args[key] = value + "_x"
            break
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            args[key] = value + 7
            break
    return {name: json.dumps(args)}


def records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for category, n in PER_CATEGORY.items():
        pairs = package.load_category(category)[:n]
        for entry, truth in pairs:
            tid = entry["id"]
            if category == "irrelevance":
                first = entry["function"][0]["name"].replace(".", "_")
                out.append({"id": tid, "category": category, "kind": "text", "result": "I cannot help with that."})
                out.append({"id": tid, "category": category, "kind": "call", "result": [{first: "{}"}]})
            elif category in package.MULTI_TURN:
                assert truth is not None
                good = multi_truth(entry, truth["ground_truth"])
                out.append({"id": tid, "category": category, "kind": "truth", "result": good})
                dropped = json.loads(json.dumps(good))
                last = next(t for t in reversed(dropped) if isinstance(t[0], list) and t[0])
                last[0].pop()
                if not last[0]:  # an empty step is no step: the handler records none
                    last.pop(0)
                out.append({"id": tid, "category": category, "kind": "dropped_call", "result": dropped})
                changed = json.loads(json.dumps(good))
                first = next(t for t in changed if isinstance(t[0], list) and t[0])
                first[0][0] = _changed(first[0][0])
                out.append({"id": tid, "category": category, "kind": "changed_argument", "result": changed})
                out.append({"id": tid, "category": category, "kind": "missing_turn", "result": good[:-1]})
            else:
                assert truth is not None
                good = single_truth_calls(truth["ground_truth"])
                out.append({"id": tid, "category": category, "kind": "truth", "result": good})
                out.append(
                    {
                        "id": tid,
                        "category": category,
                        "kind": "changed_argument",
                        "result": [_changed(good[0]), *good[1:]],
                    }
                )
                out.append({"id": tid, "category": category, "kind": "text", "result": "Here is the answer."})
    return out


def from_db(path: str) -> list[dict[str, Any]]:
    """Outputs recorded from real episodes (the base model's eval), converted by the grader's own reader."""
    from agentrft.envs.bfcl.grader import model_result
    from agentrft.store import Store

    out: list[dict[str, Any]] = []
    taken: dict[str, int] = {}
    with Store(path) as store:
        for traj in store.query_trajectories():
            category = traj.task_id.rsplit("_", 1)[0]
            category = next(c for c in (*package.MULTI_TURN, *package.SINGLE_TURN) if c == category)
            if taken.get(category, 0) >= PER_CATEGORY_RECORDED or traj.status == "error":
                continue
            taken[category] = taken.get(category, 0) + 1
            item = {"category": category, "bfcl": {"function": [], "id": traj.task_id}}
            if category in package.MULTI_TURN:
                entry = dict(next(e for e, _ in package.load_category(category) if e["id"] == traj.task_id))
                item["bfcl"] = entry
            row = {"id": traj.task_id, "category": category, "kind": "smollm2", "result": model_result(traj, item)}
            if traj.status == "truncated":  # its last reply ran into a token limit: the replay ends it there too
                row["truncated"] = True
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-db", action="append", default=[])
    args = parser.parse_args()
    rows = records()
    for db in args.from_db:
        rows += from_db(db)
    OUT.write_text(json.dumps(rows, indent=0) + "\n")
    print(f"{len(rows)} outputs for {len({r['id'] for r in rows})} tasks -> {OUT}")


if __name__ == "__main__":
    main()
