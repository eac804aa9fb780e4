"""finqa-lite tasks: a curriculum of FinQA-style questions over the synthetic corpus, with splits.

Levels (the prompt is what changes; the gold program is always numeric literals):

1. the figures are in the question; one calculation
   ("For X: revenue was $5,829 million in 2023; revenue was $5,735 million in 2022. What was ...?")
2. an excerpt of the report (relevant table rows, a few distractor rows, relevant sentences)
   is in the prompt; pick the right figures, then calculate
3. only the company and year are named: search, open, calculate
4. two reports (two companies in one year, or one company three years apart): the
   difference of one metric across them; search + open twice, then calculate (≥ 4 tool calls)

Splits: companies are shuffled once per seed; one is kept aside for the worked
examples, a quarter form `held-out`, the rest `train`. `train` and `held-out`
use the in-distribution templates; `ood` uses the out-of-distribution templates
(on held-out companies), so `ood` measures transfer to new question types.

Answers follow the FinQA convention: the program's `exe_ans` (5 decimals), so a
percentage change is a fraction (0.01639, not 1.64); the numeric grader accepts
"1.64%" for 0.0164 within its tolerance. Task ids hash the seed and the content,
so they are stable across runs.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentrft.envs.finqa.corpus import (
    FACT_LABELS,
    REPORT_YEARS,
    SERIES_YEARS,
    TABLE_ROWS,
    Company,
    Corpus,
    Report,
    fmt_number,
    fmt_prose,
)
from agentrft.envs.finqa.program import execute_program
from agentrft.envs.finqa.templates import (
    IN_DISTRIBUTION,
    OOD,
    TEMPLATES_BY_NAME,
    Template,
    bind_steps,
    compose_difference,
    render_steps,
)
from agentrft.envs.finqa.tools import Document, render_table
from agentrft.inputs import InputError
from agentrft.types import Message, Task

SPLITS: tuple[str, ...] = ("train", "held-out", "ood")
LEVELS: tuple[int, ...] = (1, 2, 3, 4)
DEFAULT_COUNTS: dict[str, int] = {"train": 300, "held-out": 60, "ood": 60}  # tasks per level
_TEXT_SENTENCE = {"r&d expense": 0, "dividends paid": 1, "employees": 2}  # index in post_text
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def numbers_in(text: str) -> set[float]:
    """Every number written in `text` (commas dropped), for leak checks."""
    return {float(m.replace(",", "")) for m in _NUMBER.findall(text)}


def answer_text(answer: float | str) -> str:
    """An exe_ans as an agent would write it: 0.01639, 94, yes."""
    if isinstance(answer, str):
        return answer
    text = f"{answer:.5f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


@dataclass
class FinqaLite:
    """The corpus plus the company split; `tasks(split, levels)` generates the curriculum."""

    seed: int = 0
    n_companies: int = 240
    heldout_fraction: float = 0.25
    counts: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_COUNTS))

    def __post_init__(self) -> None:
        self.corpus = Corpus.generate(self.seed, self.n_companies)
        order = list(self.corpus.companies)
        random.Random(f"finqa-lite:{self.seed}:split").shuffle(order)
        self.example_company: Company = order[0]
        n_held = max(2, round((len(order) - 1) * self.heldout_fraction))
        self.split_companies: dict[str, list[Company]] = {
            "held-out": order[1 : 1 + n_held],
            "train": order[1 + n_held :],
        }
        self.split_companies["ood"] = self.split_companies["held-out"]
        self.split_templates: dict[str, tuple[str, ...]] = {
            "train": IN_DISTRIBUTION,
            "held-out": IN_DISTRIBUTION,
            "ood": OOD,
        }
        self._cache: dict[tuple[str, int], list[Task]] = {}

    # ------------------------------------------------------------ public API

    def tasks(self, split: str = "train", levels: Iterable[int] = LEVELS, n: int | None = None) -> list[Task]:
        """`n` (default `counts[split]`) tasks per level, in level order."""
        if split not in SPLITS:
            raise InputError(f"unknown finqa-lite split {split!r}; valid splits: {', '.join(SPLITS)}")
        out: list[Task] = []
        for level in levels:
            if level not in LEVELS:
                raise InputError(f"unknown finqa-lite level {level!r}; valid levels: 1, 2, 3, 4")
            count = self.counts.get(split, 0) if n is None else n
            key = (split, level)
            if key not in self._cache or len(self._cache[key]) < count:
                self._cache[key] = self._generate(split, level, count)
            out.extend(self._cache[key][:count])
        return out

    def documents(self) -> list[Document]:
        """Every report as a searchable Document (for the tools)."""
        return [
            Document(
                doc_id=r.doc_id,
                title=f"{r.company.name} ({r.company.ticker}) annual report {r.year}",
                company=r.company.name,
                year=r.year,
                pre_text=tuple(r.pre_text),
                post_text=tuple(r.post_text),
                table=tuple(tuple(row) for row in r.table),
            )
            for r in self.corpus.reports.values()
        ]

    def example_task(self, level: int, template: str = "revenue_growth") -> Task:
        """A task on the company kept aside for worked examples (never in any split)."""
        rng = random.Random(f"finqa-lite:{self.seed}:example:{level}")
        other = self.split_companies["train"][0]
        task = self._make(level, TEMPLATES_BY_NAME[template], [self.example_company, other], rng, "example")
        if task is None:
            raise RuntimeError(
                f"finqa-lite (seed {self.seed}): no worked-example task for level {level}, template {template!r} "
                "(a figure of the example would leak into its prompt)"
            )
        return task

    # ------------------------------------------------------------ generation

    def _generate(self, split: str, level: int, count: int) -> list[Task]:
        rng = random.Random(f"finqa-lite:{self.seed}:{split}:{level}")
        companies = self.split_companies[split]
        templates = [TEMPLATES_BY_NAME[n] for n in self.split_templates[split]]
        if level == 4:
            templates = [t for t in templates if t.composable]
        out: list[Task] = []
        seen: set[str] = set()
        attempts = 0
        while len(out) < count and attempts < count * 50:
            attempts += 1
            template = rng.choice(templates)
            picked = rng.sample(companies, 2) if level == 4 else [rng.choice(companies)]
            task = self._make(level, template, picked, rng, split)
            if task is not None and task.id not in seen:
                seen.add(task.id)
                out.append(task)
        return out

    def _values(self, report: Report, template: Template, year: int) -> list[float]:
        return [report.facts[(key, year + off)] for key, off in template.operands]

    def _make(
        self, level: int, template: Template, companies: list[Company], rng: random.Random, split: str
    ) -> Task | None:
        if level == 4:
            return self._make_level4(template, companies, rng, split)
        co = companies[0]
        year = rng.choice([y for y in REPORT_YEARS if y - template.max_offset >= SERIES_YEARS[0]])
        report = self.corpus.report(co.name, year)
        values = self._values(report, template, year)
        program = render_steps(bind_steps(template, values))
        question = template.question_text(co.name, year)
        if level == 1:
            facts = "; ".join(
                f"{fmt_label(key)} {_verb(key)} {fmt_prose(key, v)} in {year + off}"
                for (key, off), v in zip(template.operands, values, strict=True)
            )
            prompt = f"For {co.name}: {facts}. {question}"
        elif level == 2:
            prompt = f"{self._excerpt(report, template, rng)}\n\nQuestion: {question}"
        else:
            prompt = f"{question} Find the figures in the company's {year} annual report."
            if numbers_in(prompt) & set(values):  # a figure equal to a year would leak into the prompt
                return None
        return self._task(
            split, level, template, program, report.table, prompt, [co], [year], [report.doc_id], "single"
        )

    def _make_level4(self, template: Template, companies: list[Company], rng: random.Random, split: str) -> Task | None:
        variant = rng.choice(("companies", "years"))
        if variant == "companies":
            year = rng.choice(REPORT_YEARS)
            pairs = [(companies[0], year), (companies[1], year)]
        else:
            year = rng.choice([y for y in REPORT_YEARS if y - 3 >= REPORT_YEARS[0]])
            pairs = [(companies[0], year), (companies[0], year - 3)]
        reports = [self.corpus.report(c.name, y) for c, y in pairs]
        values = [self._values(r, template, y) for r, (_, y) in zip(reports, pairs, strict=True)]
        first = bind_steps(template, values[0])
        second = bind_steps(template, values[1], shift=len(first))
        program = render_steps(compose_difference(first, second))
        a = template.noun_phrase(pairs[0][0].name, pairs[0][1])
        b = template.noun_phrase(pairs[1][0].name, pairs[1][1])
        prompt = (
            f"What was {a} minus {b}{template.unit}? "
            "Find the figures in the companies' annual reports; each report covers one year and the two before it."
        )
        if numbers_in(prompt) & set(values[0] + values[1]):
            return None
        cos = [c for c, _ in pairs]
        return self._task(
            split,
            4,
            template,
            program,
            reports[0].table,
            prompt,
            cos,
            [y for _, y in pairs],
            [r.doc_id for r in reports],
            variant,
        )

    def _excerpt(self, report: Report, template: Template, rng: random.Random) -> str:
        """Level-2 context: header, the needed rows plus two distractors (table order), needed sentences."""
        needed = {key for key, _ in template.operands}
        table_keys = needed & set(TABLE_ROWS)
        distractors = rng.sample([r for r in TABLE_ROWS if r not in needed], 2)
        rows = [report.table[0]] + [row for row in report.table[1:] if row[0] in table_keys or row[0] in distractors]
        lines = [
            f"Excerpt from {report.company.name}'s {report.year} annual report "
            "(amounts in millions of dollars, except per share data):",
            render_table(rows),
        ]
        lines += [report.post_text[_TEXT_SENTENCE[k]] for k in sorted(needed & set(_TEXT_SENTENCE))]
        return "\n".join(lines)

    def _task(
        self,
        split: str,
        level: int,
        template: Template,
        program: str,
        table: list[list[str]],
        prompt: str,
        companies: list[Company],
        years: list[int],
        doc_ids: list[str],
        variant: str,
    ) -> Task:
        answer = execute_program(program, table)
        content = f"{self.seed}|{split}|{level}|{template.name}|{[c.name for c in companies]}|{years}|{variant}"
        task_id = "fql-" + hashlib.sha256(content.encode()).hexdigest()[:16]
        return Task(
            id=task_id,
            env="finqa-lite",
            messages=[Message(role="user", content=prompt)],
            data={
                "answer": answer,
                "program": program,
                "level": level,
                "template": template.name,
                "company": companies[0].name,
                "year": years[0],
                "companies": [c.name for c in companies],
                "years": years,
                "doc_ids": doc_ids,
                "split": split,
                "variant": variant,
            },
        )


def _verb(key: str) -> str:
    return "were" if key in ("capital expenditures", "operating expenses", "dividends paid", "employees") else "was"


def fmt_label(key: str) -> str:
    return FACT_LABELS[key]


__all__ = ["DEFAULT_COUNTS", "LEVELS", "SPLITS", "FinqaLite", "answer_text", "fmt_number", "numbers_in", "render_table"]
