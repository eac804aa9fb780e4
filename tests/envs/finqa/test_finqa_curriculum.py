"""finqa-lite corpus and tasks: consistency, determinism, splits, level properties."""

from __future__ import annotations

import pytest

from agentrft.envs.finqa.corpus import Corpus
from agentrft.envs.finqa.curriculum import FinqaLite, numbers_in
from agentrft.envs.finqa.program import execute_program
from agentrft.envs.finqa.templates import IN_DISTRIBUTION, OOD, TEMPLATES


@pytest.fixture(scope="module")
def fl() -> FinqaLite:
    return FinqaLite(seed=0)


def _num(cell: str) -> float:
    return float(cell.replace("$", "").replace(",", "").strip())


def test_corpus_size_and_consistency(fl: FinqaLite) -> None:
    c = fl.corpus
    assert len(c.companies) >= 200 and len({co.name for co in c.companies}) == len(c.companies)
    assert len(c.reports) == len(c.companies) * 6
    for r in c.reports.values():
        rows = {row[0]: [_num(x) for x in row[1:]] for row in r.table[1:]}
        assert r.table[0][1:] == [str(r.year), str(r.year - 1), str(r.year - 2)]
        for i in range(3):
            assert rows["gross profit"][i] == rows["revenue"][i] - rows["cost of sales"][i]
            assert rows["operating income"][i] == rows["gross profit"][i] - rows["operating expenses"][i]
            net = rows["operating income"][i] - rows["interest expense"][i] - rows["income tax expense"][i]
            assert rows["net income"][i] == net and net > 0
        assert all(v > 0 for vals in rows.values() for v in vals)
    # the same figure agrees across overlapping reports of one company
    co = c.companies[5].name
    assert c.report(co, 2023).table[1][2] == c.report(co, 2022).table[1][1]


def test_corpus_determinism() -> None:
    a, b, other = Corpus.generate(7), Corpus.generate(7), Corpus.generate(8)
    assert a.records() == b.records()
    assert a.records() != other.records()
    assert [c.name for c in a.companies] != [c.name for c in other.companies]


def test_tasks_deterministic_and_ids_stable() -> None:
    t1 = FinqaLite(seed=3, counts={"train": 20, "held-out": 5, "ood": 5}).tasks("train")
    t2 = FinqaLite(seed=3, counts={"train": 20, "held-out": 5, "ood": 5}).tasks("train")
    assert [t.model_dump() for t in t1] == [t.model_dump() for t in t2]
    assert len({t.id for t in t1}) == len(t1) == 80
    t3 = FinqaLite(seed=4, counts={"train": 20, "held-out": 5, "ood": 5}).tasks("train")
    assert {t.id for t in t1}.isdisjoint({t.id for t in t3})


def test_split_leakage(fl: FinqaLite) -> None:
    train, held, ood = (fl.tasks(s) for s in ("train", "held-out", "ood"))
    cos = lambda ts: {c for t in ts for c in t.data["companies"]}  # noqa: E731
    temps = lambda ts: {t.data["template"] for t in ts}  # noqa: E731
    assert cos(train).isdisjoint(cos(held))
    assert cos(train).isdisjoint(cos(ood))
    assert temps(ood).isdisjoint(temps(train) | temps(held))
    assert temps(ood) == set(OOD) and temps(train) == set(IN_DISTRIBUTION)
    assert fl.example_company.name not in cos(train) | cos(held) | cos(ood)
    assert len(TEMPLATES) - len(OOD) >= 12
    assert {t.data["split"] for t in held} == {"held-out"}


def test_answers_are_program_results(fl: FinqaLite) -> None:
    for t in fl.tasks("held-out") + fl.tasks("ood"):
        doc = fl.corpus.reports[t.data["doc_ids"][0]]
        assert execute_program(t.data["program"], doc.table) == t.data["answer"]
        assert set(t.data) >= {"answer", "program", "level", "template", "company", "year", "doc_ids", "split"}


def _operands(program: str) -> set[float]:
    out = set()
    for step in program.split("), "):
        args = step.split("(", 1)[1].rstrip(")").split(", ")
        out |= {float(a) for a in args if a[0].isdigit()}
    return out - {0.5}  # the CAGR exponent is not a figure


def test_level_properties(fl: FinqaLite) -> None:
    tasks = fl.tasks("held-out") + fl.tasks("ood")
    by_level = {lv: [t for t in tasks if t.data["level"] == lv] for lv in (1, 2, 3, 4)}
    assert all(len(v) == 120 for v in by_level.values())  # 60 held-out + 60 ood
    for t in by_level[1] + by_level[2]:
        assert _operands(t.data["program"]) <= numbers_in(t.messages[-1].text()), t.id
    for t in by_level[3] + by_level[4]:
        assert not (_operands(t.data["program"]) & numbers_in(t.messages[-1].text())), t.id
        assert t.data["company"] in t.messages[-1].text() and str(t.data["year"]) in t.messages[-1].text()
    for t in by_level[4]:
        assert len(set(t.data["doc_ids"])) == 2 and t.data["program"].count("(") >= 3


def test_unknown_split_and_level(fl: FinqaLite) -> None:
    with pytest.raises(ValueError, match="valid splits: train, held-out, ood"):
        fl.tasks("test")
    with pytest.raises(ValueError, match="valid levels"):
        fl.tasks("train", levels=[5])
