"""Question templates of finqa-lite, each with a gold FinQA program.

A template names its operands as (fact key, year offset from the question year)
and its steps as FinQA ops over `o0, o1, ...` (operands), `#k` (earlier steps)
and `const_*`. `instantiate` fills in a report's figures and gives the program
text, e.g. `subtract(5829, 5735), divide(#0, 5735)`. Templates with
`ood=True` are kept out of train and held-out, to measure transfer to question
types never trained on. `composable` templates (numeric answers) can be
combined into level-4 questions across two reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrft.envs.finqa.corpus import fmt_number


@dataclass(frozen=True)
class Template:
    name: str
    phrase: str  # noun phrase with {co}, {y}, {y1}, {y2}: "the gross margin of {co} in {y}"
    operands: tuple[tuple[str, int], ...]  # (fact key, year offset)
    steps: tuple[tuple[str, str, str], ...]  # (op, arg, arg) with o<i>, #k, const_*
    ood: bool = False
    composable: bool = True
    question: str | None = None  # full question when "What was <phrase>?" does not fit
    unit: str = ""  # appended to the question, e.g. " (in millions)"

    def question_text(self, company: str, year: int) -> str:
        fill = {"co": company, "y": year, "y1": year - 1, "y2": year - 2}
        text = self.question.format(**fill) if self.question else f"What was {self.phrase.format(**fill)}?"
        return text[:-1] + f"{self.unit}?" if self.unit else text

    def noun_phrase(self, company: str, year: int) -> str:
        return self.phrase.format(co=company, y=year, y1=year - 1, y2=year - 2)

    @property
    def max_offset(self) -> int:
        return max(-off for _, off in self.operands)


def _pct(key: str) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str, str], ...]]:
    return ((key, 0), (key, -1)), (("subtract", "o0", "o1"), ("divide", "#0", "o1"))


def _ratio(num: str, den: str) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str, str], ...]]:
    return ((num, 0), (den, 0)), (("divide", "o0", "o1"),)


def _t(name: str, phrase: str, spec: tuple, **kw: object) -> Template:
    operands, steps = spec
    return Template(name=name, phrase=phrase, operands=operands, steps=steps, **kw)  # type: ignore[arg-type]


TEMPLATES: tuple[Template, ...] = (
    _t("revenue_growth", "the percentage change in {co}'s revenue from {y1} to {y}", _pct("revenue")),
    _t("gross_margin", "the gross margin (gross profit / revenue) of {co} in {y}", _ratio("gross profit", "revenue")),
    _t(
        "operating_margin",
        "the operating margin (operating income / revenue) of {co} in {y}",
        _ratio("operating income", "revenue"),
    ),
    _t("net_margin", "the net margin (net income / revenue) of {co} in {y}", _ratio("net income", "revenue")),
    _t(
        "net_income_change",
        "the change in {co}'s net income from {y1} to {y}",
        ((("net income", 0), ("net income", -1)), (("subtract", "o0", "o1"),)),
        unit=" (in millions)",
    ),
    _t(
        "debt_to_cash",
        "the ratio of total debt to cash and equivalents of {co} at the end of {y}",
        _ratio("total debt", "cash and equivalents"),
    ),
    _t(
        "average_revenue",
        "the average revenue of {co} over {y2}, {y1} and {y}",
        (
            (("revenue", 0), ("revenue", -1), ("revenue", -2)),
            (("add", "o0", "o1"), ("add", "#0", "o2"), ("divide", "#1", "const_3")),
        ),
        unit=" (in millions)",
    ),
    _t("debt_growth", "the percentage change in {co}'s total debt from {y1} to {y}", _pct("total debt")),
    _t(
        "interest_coverage",
        "the interest coverage (operating income / interest expense) of {co} in {y}",
        _ratio("operating income", "interest expense"),
    ),
    _t(
        "effective_tax_rate",
        "the effective tax rate (income tax expense / (operating income - interest expense)) of {co} in {y}",
        (
            (("income tax expense", 0), ("operating income", 0), ("interest expense", 0)),
            (("subtract", "o1", "o2"), ("divide", "o0", "#0")),
        ),
    ),
    _t("eps_growth", "the percentage change in {co}'s diluted eps from {y1} to {y}", _pct("diluted eps")),
    _t(
        "capex_intensity",
        "capital expenditures as a share of revenue for {co} in {y}",
        _ratio("capital expenditures", "revenue"),
    ),
    _t(
        "dividend_payout",
        "the dividend payout ratio (dividends paid / net income) of {co} in {y}",
        _ratio("dividends paid", "net income"),
    ),
    _t(
        "rd_intensity",
        "research and development expense as a share of revenue for {co} in {y}",
        _ratio("r&d expense", "revenue"),
    ),
    # ---- out-of-distribution templates: never in train or held-out
    _t(
        "revenue_cagr",
        "the compound annual growth rate of {co}'s revenue from {y2} to {y}",
        (
            (("revenue", 0), ("revenue", -2)),
            (("divide", "o0", "o1"), ("exp", "#0", "0.5"), ("subtract", "#1", "const_1")),
        ),
        ood=True,
    ),
    _t(
        "net_debt_change",
        "the change in {co}'s net debt (total debt - cash and equivalents) from {y1} to {y}",
        (
            (("total debt", 0), ("cash and equivalents", 0), ("total debt", -1), ("cash and equivalents", -1)),
            (("subtract", "o0", "o1"), ("subtract", "o2", "o3"), ("subtract", "#0", "#1")),
        ),
        ood=True,
        unit=" (in millions)",
    ),
    _t(
        "opex_to_gross_profit",
        "operating expenses as a share of gross profit for {co} in {y}",
        _ratio("operating expenses", "gross profit"),
        ood=True,
    ),
    _t(
        "rd_growth",
        "the percentage change in {co}'s research and development expense from {y1} to {y}",
        _pct("r&d expense"),
        ood=True,
    ),
    _t(
        "net_margin_improved",
        "whether {co}'s net margin improved from {y1} to {y}",
        (
            (("net income", 0), ("revenue", 0), ("net income", -1), ("revenue", -1)),
            (("divide", "o0", "o1"), ("divide", "o2", "o3"), ("greater", "#0", "#1")),
        ),
        ood=True,
        composable=False,
        question="Was {co}'s net margin (net income / revenue) in {y} greater than in {y1}? Answer yes or no.",
    ),
)
TEMPLATES_BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}
IN_DISTRIBUTION: tuple[str, ...] = tuple(t.name for t in TEMPLATES if not t.ood)
OOD: tuple[str, ...] = tuple(t.name for t in TEMPLATES if t.ood)


def render_steps(steps: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{op}({a}, {b})" for op, a, b in steps)


def bind_steps(template: Template, values: list[float], shift: int = 0) -> list[tuple[str, str, str]]:
    """Steps with operands replaced by program literals and `#k` shifted by `shift` (for composition)."""

    def arg(token: str) -> str:
        if token.startswith("o") and token[1:].isdigit():
            i = int(token[1:])
            return fmt_number(template.operands[i][0], values[i])
        if token.startswith("#"):
            return f"#{int(token[1:]) + shift}"
        return token

    return [(op, arg(a), arg(b)) for op, a, b in template.steps]


def compose_difference(
    first: list[tuple[str, str, str]], second: list[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    """`first - second` as one program: both step lists, then subtract their last results."""
    return [*first, *second, ("subtract", f"#{len(first) - 1}", f"#{len(first) + len(second) - 1}")]
