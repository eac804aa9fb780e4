"""FinqaJsonEnv: an official FinQA file as tasks, with the finqa-lite tools and schemas."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agentrft.envs.finqa.env import FinqaLiteEnv
from agentrft.envs.finqa.json_env import FinqaJsonEnv
from agentrft.envs.registry import make_env


def test_finqa_json_env(tmp_path: Path) -> None:
    record = {
        "id": "ADI/2009/page_49.pdf-1",
        "filename": "ADI/2009/page_49.pdf",
        "pre_text": ["net revenue rose in 2009 ."],
        "post_text": ["no other items ."],
        "table": [["", "2009", "2008"], ["net revenue", "$ 5829", "$ 5735"]],
        "qa": {
            "question": "what was the percentage change in net revenue from 2008 to 2009?",
            "program": "subtract(5829, 5735), divide(#0, 5735)",
            "exe_ans": 0.01639,
        },
    }
    p = tmp_path / "test.json"
    p.write_text(json.dumps([record]))
    env = make_env(f"finqa:{p}")
    assert isinstance(env, FinqaJsonEnv)
    (task,) = env.tasks("test")
    assert task.data["answer"] == 0.01639 and task.data["doc_ids"] == ["ADI/2009/page_49.pdf"]
    assert "ADI/2009/page_49.pdf" in task.messages[0].text()
    ep = env.start(task)

    async def go() -> list:
        return [
            await ep.call_tool("search", {"query": "ADI 2009"}),
            await ep.call_tool("open", {"doc_id": "ADI/2009/page_49.pdf"}),
            await ep.call_tool("calculate", {"expression": "table_max(net revenue, none)"}),
        ]

    found, opened, mx = asyncio.run(go())
    assert "doc_id=ADI/2009/page_49.pdf" in found.content and opened.ok and mx.content == "5829"
    assert env.ref().tool_schema_hash == FinqaLiteEnv(levels=3).ref().tool_schema_hash


def test_record_without_filename_is_named_by_its_id(tmp_path: Path) -> None:
    record = {
        "id": "ADI/2009/page_49.pdf-3",
        "pre_text": [],
        "post_text": [],
        "table": [["", "2009"], ["net revenue", "$ 5829"]],
        "qa": {"question": "what was net revenue in 2009?", "program": "add(5829, const_0)", "exe_ans": 5829.0},
    }
    p = tmp_path / "dev.json"
    p.write_text(json.dumps([record]))
    env = FinqaJsonEnv(p)
    (task,) = env.tasks()
    assert task.data["doc_ids"] == ["ADI/2009/page_49.pdf-3"]
    assert (task.data["company"], task.data["year"]) == ("ADI", 2009)  # FinQA ids start with the filename
    opened = asyncio.run(env.start(task).call_tool("open", {"doc_id": "ADI/2009/page_49.pdf-3"}))
    assert opened.ok and "net revenue | $ 5829" in opened.content
