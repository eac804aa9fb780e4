"""search ranking, open paging and scope, calculate with the in-scope table."""

from __future__ import annotations

import asyncio

from agentrft.envs.finqa.tools import Document, DocumentIndex, FinqaToolState, finqa_toolbox, paginate

TABLE = (("", "2023", "2022"), ("revenue", "$ 5,829", "$ 5,735"), ("net income", "$ 410", "$ 380"))


def _doc(doc_id: str, company: str, year: int, extra: str = "") -> Document:
    return Document(
        doc_id,
        f"{company} annual report {year}",
        company,
        year,
        (f"{company} makes things. {extra}",),
        ("employees were 1,200.",),
        TABLE,
    )


def _index(page_chars: int = 1500) -> DocumentIndex:
    return DocumentIndex(
        [
            _doc("ACME/2023/page_1.pdf", "Acme Robotics", 2023),
            _doc("ACME/2022/page_1.pdf", "Acme Robotics", 2022),
            _doc("BOLT/2023/page_2.pdf", "Bolt Foods", 2023, "Acme is a competitor."),
            _doc("CEDA/2023/page_3.pdf", "Cedar Labs", 2023),
        ],
        page_chars=page_chars,
    )


def test_search_ranks_company_and_year_first() -> None:
    ix = _index()
    hits = ix.search("Acme Robotics 2022", 5)
    assert hits[0][0].doc_id == "ACME/2022/page_1.pdf"
    assert ix.search("acme robotics 2023")[0][0].doc_id == "ACME/2023/page_1.pdf"
    assert ix.search("Bolt Foods")[0][0].doc_id == "BOLT/2023/page_2.pdf"
    assert ix.search("zzz nothing") == [] and ix.search("!!!") == []
    text = FinqaToolState(ix).search("Cedar Labs", k=1)
    assert text.startswith("1. doc_id=CEDA/2023/page_3.pdf | Cedar Labs | 2023 |") and "\n" not in text


def test_paginate_cuts_on_lines() -> None:
    pages = paginate("aaaa\nbbbb\ncccc\n" + "d" * 12, 10)
    assert pages == ["aaaa\nbbbb", "cccc", "dddddddddd", "dd"]


def test_open_pages_and_scope() -> None:
    state = FinqaToolState(_index(page_chars=60))
    first = state.open("ACME/2023/page_1.pdf")
    n = len(state.index.pages("ACME/2023/page_1.pdf"))
    assert n >= 2 and f"[page 1 of {n}; call open with page=2 for more]" in first
    assert "revenue | $ 5,829 | $ 5,735" in "".join(state.index.pages("ACME/2023/page_1.pdf"))
    last = state.open("acme/2023/page_1.pdf", page=n)  # doc ids match case-insensitively
    assert last.endswith(f"[page {n} of {n}]")
    assert state.scope is not None and state.scope.doc_id == "ACME/2023/page_1.pdf"


def test_tools_through_toolbox() -> None:
    state = FinqaToolState(_index())
    box = finqa_toolbox(state)

    async def go() -> list:
        return [
            await box.call("calculate", {"expression": "table_average(revenue, none)"}),
            await box.call("open", {"doc_id": "NOPE"}),
            await box.call("open", {"doc_id": "ACME/2023/page_1.pdf", "page": 9}),
            await box.call("open", {"doc_id": "ACME/2023/page_1.pdf"}),
            await box.call("calculate", {"expression": "table_average(revenue, none)"}),
            await box.call("calculate", {"expression": "subtract(5829, 5735), divide(#0, 5735)"}),
            await box.call("calculate", {"expression": "1 / 0"}),
        ]

    no_scope, missing, bad_page, opened, avg, prog, div0 = asyncio.run(go())
    assert no_scope.error_kind == "exception" and "call open(doc_id)" in no_scope.content
    assert missing.error_kind == "exception" and "use search" in missing.content
    assert bad_page.error_kind == "exception" and "has 1 page(s)" in bad_page.content
    assert opened.ok and "Acme Robotics" in opened.content
    assert avg.content == "5782"
    assert prog.content == "0.01639"
    assert div0.error_kind == "exception"
