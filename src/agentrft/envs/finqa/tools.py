"""Built-in tools over a corpus of FinQA-style reports: `search`, `open`, `calculate`.

`DocumentIndex` is built once per environment (an in-memory SQLite FTS5 table,
BM25 ranking, the title column weighted 10× so that "Company 2023" finds that
company's 2023 report first) and shared by all episodes. `FinqaToolState`
holds one episode's state: the document in scope, i.e. the last one opened,
whose table `calculate` uses for `table_sum/average/max/min(row, none)`.

`open` shows the table before the text: for an agent with a short context the
table is what most questions need, and pages are cut on line boundaries.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrft.envs.finqa.calc import calculate
from agentrft.tools.registry import Tool, Toolbox

DEFAULT_PAGE_CHARS = 1500
MAX_QUERY_TERMS = 32
_YEAR = re.compile(r"(19|20)\d\d")


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str  # e.g. "Dorian Media Co. (DOME) annual report 2018"
    company: str
    year: int | None
    pre_text: tuple[str, ...]
    post_text: tuple[str, ...]
    table: tuple[tuple[str, ...], ...]


def render_table(rows: Sequence[Sequence[str]]) -> str:
    """`row | col1 | col2` lines; an empty header corner is shown as `(row)`."""
    lines = []
    for i, row in enumerate(rows):
        cells = [str(c) for c in row]
        if i == 0 and cells and not cells[0]:
            cells[0] = "(row)"
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def document_text(doc: Document) -> str:
    parts = [f"Document {doc.doc_id}: {doc.title}", "", "Table:", render_table(doc.table), "", "Text:"]
    parts += list(doc.pre_text) + list(doc.post_text)
    return "\n".join(parts)


def paginate(text: str, page_chars: int) -> list[str]:
    """Pages of at most `page_chars` characters, cut at line ends (a longer line is cut hard)."""
    pages: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines():
        while len(line) > page_chars:
            if current:
                pages.append("\n".join(current))
                current, size = [], 0
            pages.append(line[:page_chars])
            line = line[page_chars:]
        if current and size + len(line) + 1 > page_chars:
            pages.append("\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        pages.append("\n".join(current))
    return pages or [""]


class DocumentIndex:
    """Full-text index of documents (SQLite FTS5, BM25), plus paged rendering for `open`."""

    def __init__(self, docs: Iterable[Document], page_chars: int = DEFAULT_PAGE_CHARS):
        self.docs: dict[str, Document] = {}
        self._lower: dict[str, str] = {}
        self.page_chars = page_chars
        self._pages: dict[str, list[str]] = {}
        # One connection shared across threads (tools run in worker threads); the lock serialises use.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE docs USING fts5(doc_id UNINDEXED, title, body)")
        rows = []
        for doc in docs:
            if doc.doc_id in self.docs:
                continue  # FinQA files repeat a page for each of its questions
            self.docs[doc.doc_id] = doc
            self._lower[doc.doc_id.lower()] = doc.doc_id
            body = "\n".join([*doc.pre_text, render_table(doc.table), *doc.post_text])
            # FTS5 computes IDF over whole rows, and a year appears in the bodies of three reports' tables;
            # a dedicated `fy2020` token in the title alone makes "Company 2020" rank that year's report first.
            fiscal = f" fy{doc.year}" if doc.year else ""
            rows.append((doc.doc_id, f"{doc.title} {doc.doc_id}{fiscal}", body))
        self._db.executemany("INSERT INTO docs(doc_id, title, body) VALUES (?, ?, ?)", rows)

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, doc_id: str) -> Document | None:
        key = doc_id.strip()
        return self.docs.get(key) or self.docs.get(self._lower.get(key.lower(), ""))

    def search(self, query: str, k: int = 5) -> list[tuple[Document, str]]:
        """Top-k (document, snippet) by BM25; any word may match (OR), rarer words weigh more."""
        terms = re.findall(r"\w+", query.lower())[:MAX_QUERY_TERMS]
        if not terms:
            return []
        terms += [f"fy{t}" for t in terms if _YEAR.fullmatch(t)]
        match = " OR ".join(f'"{t}"' for t in dict.fromkeys(terms))
        sql = (
            "SELECT doc_id, snippet(docs, 2, '', '', '…', 12) FROM docs WHERE docs MATCH ? "
            "ORDER BY bm25(docs, 0.0, 10.0, 1.0), doc_id LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(sql, (match, k)).fetchall()
        return [(self.docs[d], " ".join(s.split())) for d, s in rows]

    def pages(self, doc_id: str) -> list[str]:
        if doc_id not in self._pages:
            self._pages[doc_id] = paginate(document_text(self.docs[doc_id]), self.page_chars)
        return self._pages[doc_id]


class FinqaToolState:
    """One episode's tools and state. Method docstrings are the tool descriptions the model reads."""

    def __init__(self, index: DocumentIndex, scope: Document | None = None):
        self.index = index
        self.scope = scope
        self.opened: list[str] = []

    def search(self, query: str, k: int = 5) -> str:
        """Search the annual reports by keywords, e.g. a company name and a year.

        Args:
            query: keywords such as "Dorian Media 2018 revenue".
            k: how many results to return (1-10).
        """
        k = max(1, min(int(k), 10))
        hits = self.index.search(query, k)
        if not hits:
            return f"No documents match {query!r}. Try the company name and the year."
        lines = [
            f"{i}. doc_id={doc.doc_id} | {doc.company} | {doc.year or ''} | {snip}"
            for i, (doc, snip) in enumerate(hits, 1)
        ]
        return "\n".join(lines)

    def open(self, doc_id: str, page: int = 1) -> str:
        """Open a report by its doc_id (from search) and read one page of its table and text.

        Args:
            doc_id: the document id returned by search, e.g. "DOME/2018/page_68.pdf".
            page: page number, starting at 1.
        """
        doc = self.index.get(doc_id)
        if doc is None:
            raise LookupError(f"no document with doc_id {doc_id!r}; use search to find document ids")
        pages = self.index.pages(doc.doc_id)
        if not 1 <= page <= len(pages):
            raise ValueError(f"page {page} does not exist; {doc.doc_id} has {len(pages)} page(s)")
        self.scope = doc  # the table of the last opened document is the one table ops read
        self.opened.append(doc.doc_id)
        more = f"; call open with page={page + 1} for more" if page < len(pages) else ""
        return f"{pages[page - 1]}\n[page {page} of {len(pages)}{more}]"

    def calculate(self, expression: str) -> str:
        """Evaluate arithmetic like "(5829 - 5735) / 5735" or a FinQA program like
        "subtract(5829, 5735), divide(#0, 5735)". table_average(row name, none) and
        table_sum/max/min read the table of the last opened document.

        Args:
            expression: the arithmetic expression or FinQA program.
        """
        if self.scope is None and "table_" in expression:
            raise ValueError("no document is open; call open(doc_id) before table_sum/average/max/min")
        table = [list(r) for r in self.scope.table] if self.scope is not None else None
        return calculate(expression, table)


_PROTOTYPES: dict[tuple[float, int], list[Tool]] = {}


def finqa_toolbox(state: FinqaToolState, *, timeout_s: float = 10.0, max_output_chars: int = 2000) -> Toolbox:
    """The three tools bound to `state`. Schemas and validators are built once and reused."""
    key = (timeout_s, max_output_chars)
    if key not in _PROTOTYPES:
        probe = FinqaToolState(DocumentIndex([]))
        _PROTOTYPES[key] = [
            Tool.from_function(fn, timeout_s=timeout_s, max_output_chars=max_output_chars)
            for fn in (probe.search, probe.open, probe.calculate)
        ]
    return Toolbox(dataclasses.replace(t, fn=getattr(state, t.name)) for t in _PROTOTYPES[key])


def finqa_tool_schemas() -> list[dict[str, Any]]:
    return finqa_toolbox(FinqaToolState(DocumentIndex([]))).schemas()
