"""`FinqaJsonEnv`: the same tools and grader over a user's official FinQA JSON file.

Each record is one task. A FinQA question presumes its report page ("what was
the change from 2008 to 2009?" names no company), so the prompt names the
page's doc_id; the agent opens it (search works over every page of the file)
and calculates. The file is the split: `tasks(split)` returns all of its
records whatever `split` says, and `data["split"]` records the file's stem.
Records without `exe_ans` (the private test split) get `answer = None`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from agentrft.envs.base import Environment, EnvLimits
from agentrft.envs.finqa.dataset import FinqaRecord, load_finqa_json
from agentrft.envs.finqa.env import LEVEL_LIMITS, SYSTEM_PROMPT
from agentrft.envs.finqa.tools import Document, DocumentIndex, FinqaToolState, finqa_tool_schemas, finqa_toolbox
from agentrft.envs.plugins import EnvSpec
from agentrft.envs.toolbox_episode import ToolboxEpisode
from agentrft.types import Message, Task

_FILENAME = re.compile(r"^([^/]+)/(\d{4})/")


def record_document(record: FinqaRecord) -> Document:
    """A FinQA record's page as a searchable Document (company = ticker, year from the filename).

    Without a filename the record id names the page; FinQA ids start with the filename
    (``ADI/2009/page_49.pdf-1``), so company and year are usually still found.
    """
    source = record.filename or record.id
    m = _FILENAME.match(source)
    company, year = (m.group(1), int(m.group(2))) if m else (source, None)
    return Document(
        doc_id=source,
        title=f"{company} annual report {year or ''} {source}".strip(),
        company=company,
        year=year,
        pre_text=tuple(record.pre_text),
        post_text=tuple(record.post_text),
        table=tuple(tuple(str(c) for c in row) for row in record.table),
    )


class FinqaJsonEnv(Environment):
    name = "finqa"
    version = "1"

    def __init__(self, path: str | Path, *, limits: EnvLimits | None = None, page_chars: int = 1500):
        self.path = Path(path)
        self.records = load_finqa_json(self.path)  # raises FinqaDataError naming file, record and field
        self.limits = limits or LEVEL_LIMITS[3]
        self.index = DocumentIndex([record_document(r) for r in self.records], page_chars=page_chars)
        self._tasks = [self._task(r) for r in self.records]

    @classmethod
    def from_spec(cls, spec: EnvSpec, **kwargs: Any) -> FinqaJsonEnv:
        """``finqa:PATH.json``; no options."""
        if "?" in spec.text.partition(":")[0]:  # `finqa?x:PATH`: the text after `?` would vanish
            raise spec.error("finqa takes no options; write finqa:PATH.json")
        path = spec.text.partition(":")[2]  # the whole rest: a path may hold '?'
        if not path:
            raise spec.error("finqa needs a path, e.g. finqa:data/test.json")
        return cls(path, **kwargs)

    def _task(self, record: FinqaRecord) -> Task:
        doc = record_document(record)
        prompt = (
            f"{record.qa.question.strip()}\n"
            f"The question is about the report page with doc_id {doc.doc_id}; open it to read its table and text."
        )
        return Task(
            id=f"finqa-{record.id}",
            env=self.name,
            messages=[Message(role="user", content=prompt)],
            data={
                "answer": record.qa.exe_ans,
                "program": record.qa.program,
                "level": 3,
                "template": None,
                "company": doc.company,
                "year": doc.year,
                "doc_ids": [doc.doc_id],
                "split": self.path.stem,
                "finqa_id": record.id,
                "gold_inds": dict(record.qa.gold_inds),
            },
        )

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def tool_schemas(self) -> list[dict[str, Any]]:
        return finqa_tool_schemas()

    def tasks(self, split: str = "train") -> list[Task]:
        return list(self._tasks)

    def start(self, task: Task) -> ToolboxEpisode:
        state = FinqaToolState(self.index)
        toolbox = finqa_toolbox(state, timeout_s=self.limits.tool_timeout_s)
        return ToolboxEpisode(task, toolbox, self.limits.max_tool_calls, state)
