"""The finqa-lite corpus: deterministic synthetic annual reports in the FinQA record format.

`Corpus.generate(seed)` makes `n_companies` companies (synthetic names, tickers,
sectors) with an underlying yearly series 2016–2023 of consistent figures
(gross profit = revenue − cost of sales, operating income = gross profit −
operating expenses, net income = operating income − interest − tax, diluted EPS
= net income / diluted shares), and one report per company-year 2018–2023.
Each report's table holds the report year and the two years before it, like a
real 10-K; a few figures (R&D, dividends, employees) live only in the text, so
some questions need the text and not just the table.

All money is in millions of dollars and integral (except EPS), so text, table
and programs agree exactly. All figures are positive: the official FinQA
executor cannot read filing-style negatives "(123)" in table operations.
Generation uses `random.Random(str)`, which is seeded through sha512 and thus
identical across runs and machines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

REPORT_YEARS: tuple[int, ...] = tuple(range(2018, 2024))
SERIES_YEARS: tuple[int, ...] = tuple(range(2016, 2024))
TABLE_SPAN = 3  # columns per report: the report year and the two before it

# Table rows in report order: (row name as written in column 0, fact key).
TABLE_ROWS: tuple[str, ...] = (
    "revenue",
    "cost of sales",
    "gross profit",
    "operating expenses",
    "operating income",
    "interest expense",
    "income tax expense",
    "net income",
    "diluted eps",
    "cash and equivalents",
    "total debt",
    "capital expenditures",
)
TEXT_FACTS: tuple[str, ...] = ("r&d expense", "dividends paid", "employees")

# How a fact is named in prose (level 1 and 2 prompts).
FACT_LABELS: dict[str, str] = {
    "revenue": "revenue",
    "cost of sales": "cost of sales",
    "gross profit": "gross profit",
    "operating expenses": "operating expenses",
    "operating income": "operating income",
    "interest expense": "interest expense",
    "income tax expense": "income tax expense",
    "net income": "net income",
    "diluted eps": "diluted EPS",
    "cash and equivalents": "cash and equivalents",
    "total debt": "total debt",
    "capital expenditures": "capital expenditures",
    "r&d expense": "research and development expense",
    "dividends paid": "dividends paid",
    "employees": "employees",
}

_PREFIXES = [
    "Arbor",
    "Beacon",
    "Cedar",
    "Dorian",
    "Elmstone",
    "Falcon",
    "Granite",
    "Harbor",
    "Ironwood",
    "Juniper",
    "Kestrel",
    "Lumen",
    "Meridian",
    "Northgate",
    "Onyx",
    "Pinnacle",
    "Quarry",
    "Redwood",
    "Summit",
    "Tidewater",
    "Umber",
    "Vantage",
    "Willow",
    "Xenith",
    "Yardley",
    "Zephyr",
    "Alder",
    "Bramble",
    "Copper",
    "Driftwood",
    "Ember",
    "Fjord",
    "Glacier",
    "Hawthorn",
    "Indigo",
    "Jasper",
    "Keystone",
    "Larch",
    "Marlow",
    "Nimbus",
]
_CORES = [
    "Dynamics",
    "Systems",
    "Logistics",
    "Foods",
    "Energy",
    "Health",
    "Labs",
    "Materials",
    "Networks",
    "Robotics",
    "Textiles",
    "Minerals",
    "Pharma",
    "Motors",
    "Analytics",
    "Brands",
    "Marine",
    "Aerospace",
    "Utilities",
    "Retail",
    "Biotech",
    "Devices",
    "Chemicals",
    "Media",
]
_SUFFIXES = ("Inc.", "Corp.", "Holdings", "Group", "plc", "Co.")
SECTORS = (
    "industrials",
    "consumer staples",
    "energy",
    "health care",
    "technology",
    "materials",
    "utilities",
    "consumer discretionary",
    "communication services",
    "transportation",
)
# R&D as a share of revenue depends on the sector, which makes the text facts less uniform.
_RD_SHARE = {"technology": (0.08, 0.18), "health care": (0.10, 0.20)}
_COLOUR = (
    "Management attributes the change mainly to pricing and product mix.",
    "Results reflect higher volumes in the company's core markets.",
    "Foreign currency movements had a modest effect on reported results.",
    "The company continued to invest in capacity and digital initiatives.",
    "Supply chain costs eased during the second half of the year.",
    "The board reaffirmed its capital allocation priorities during the year.",
)


@dataclass(frozen=True)
class Company:
    index: int
    name: str
    ticker: str
    sector: str


@dataclass
class Report:
    """One annual report (FinQA record) plus the facts it states, for question generation."""

    doc_id: str  # FinQA-style filename, e.g. "ARDY/2023/page_41.pdf"
    company: Company
    year: int
    pre_text: list[str]
    post_text: list[str]
    table: list[list[str]]
    facts: dict[tuple[str, int], float] = field(default_factory=dict)  # (fact key, year) -> value stated here

    def to_record(self) -> dict[str, Any]:
        """The report as a FinQA record (without `qa`)."""
        return {
            "pre_text": list(self.pre_text),
            "post_text": list(self.post_text),
            "table": [list(r) for r in self.table],
            "filename": self.doc_id,
            "id": self.doc_id,
            "company": self.company.name,
            "ticker": self.company.ticker,
            "sector": self.company.sector,
            "year": self.year,
        }


def fmt_number(key: str, value: float) -> str:
    """A figure as a program literal: integers without commas, EPS with two decimals."""
    return f"{value:.2f}" if key == "diluted eps" else str(int(value))


def fmt_money_cell(key: str, value: float) -> str:
    """A table cell as filings print it: `$ 5,829`, `$ 2.45`."""
    return f"$ {value:,.2f}" if key == "diluted eps" else f"$ {int(value):,}"


def fmt_prose(key: str, value: float) -> str:
    """A figure as prose states it: `$5,829 million`, `$2.45`, `12,400`."""
    if key == "diluted eps":
        return f"${value:,.2f}"
    if key == "employees":
        return f"{int(value):,}"
    return f"${int(value):,} million"


def _series(rng: random.Random, sector: str) -> dict[int, dict[str, float]]:
    """Consistent yearly figures for one company (all in $ millions, except EPS and employees)."""
    revenue = rng.randint(400, 20000)
    cogs_share = rng.uniform(0.45, 0.72)
    opex_share = rng.uniform(0.08, 0.18)
    shares = rng.randint(40, 900)
    rd_lo, rd_hi = _RD_SHARE.get(sector, (0.01, 0.05))
    rd_share = rng.uniform(rd_lo, rd_hi)
    debt_share = rng.uniform(0.1, 0.6)
    cash_share = rng.uniform(0.04, 0.25)
    revenue_per_employee = rng.uniform(0.15, 0.6)
    out: dict[int, dict[str, float]] = {}
    for year in SERIES_YEARS:
        if year != SERIES_YEARS[0]:
            revenue = max(200, round(revenue * (1 + rng.gauss(0.05, 0.08))))
        cogs_share = min(0.75, max(0.35, cogs_share + rng.gauss(0, 0.015)))
        opex_share = min(0.18, max(0.05, opex_share + rng.gauss(0, 0.01)))
        cogs = round(revenue * cogs_share)
        gross = revenue - cogs
        opex = round(revenue * opex_share)
        operating = gross - opex
        debt = max(20, round(revenue * debt_share * rng.uniform(0.85, 1.15)))
        interest = max(1, round(debt * rng.uniform(0.03, 0.07)))
        interest = min(interest, max(1, operating // 4))  # keep pre-tax income positive
        pretax = operating - interest
        tax = max(1, round(pretax * rng.uniform(0.18, 0.27)))
        net = pretax - tax
        rd = max(1, round(revenue * rd_share * rng.uniform(0.9, 1.1)))
        out[year] = {
            "revenue": revenue,
            "cost of sales": cogs,
            "gross profit": gross,
            "operating expenses": opex,
            "operating income": operating,
            "interest expense": interest,
            "income tax expense": tax,
            "net income": net,
            "diluted eps": round(net / shares, 2) or 0.01,
            "cash and equivalents": max(5, round(revenue * cash_share * rng.uniform(0.8, 1.2))),
            "total debt": debt,
            "capital expenditures": max(2, round(revenue * rng.uniform(0.03, 0.1))),
            "r&d expense": rd,
            "dividends paid": max(1, round(net * rng.uniform(0.2, 0.5))),
            "employees": max(100, round(revenue / revenue_per_employee, -2)),
            "diluted shares": shares,
        }
    return out


def _companies(seed: int, n: int) -> list[Company]:
    rng = random.Random(f"finqa-lite:{seed}:companies")
    pairs = [(p, c) for p in _PREFIXES for c in _CORES]
    if n > len(pairs):
        raise ValueError(f"n_companies={n} exceeds the {len(pairs)} distinct synthetic names")
    chosen = rng.sample(pairs, n)
    tickers: set[str] = set()
    out = []
    for i, (prefix, core) in enumerate(chosen):
        ticker = (prefix[:2] + core[:2]).upper()
        k = 2
        while ticker in tickers:  # collisions get a distinguishing trailing letter
            ticker = (prefix[:2] + core[:2]).upper() + core[min(k, len(core) - 1)].upper() + str(k)
            k += 1
        tickers.add(ticker)
        out.append(Company(i, f"{prefix} {core} {rng.choice(_SUFFIXES)}", ticker, rng.choice(SECTORS)))
    return out


def _report(company: Company, year: int, series: dict[int, dict[str, float]], rng: random.Random) -> Report:
    cols = [year - i for i in range(TABLE_SPAN)]
    table = [[""] + [str(y) for y in cols]]
    facts: dict[tuple[str, int], float] = {}
    for row in TABLE_ROWS:
        table.append([row] + [fmt_money_cell(row, series[y][row]) for y in cols])
        facts.update({(row, y): series[y][row] for y in cols})
    cur, prev = series[year], series[year - 1]
    pre_text = [
        f"{company.name} ( {company.ticker} ) operates in the {company.sector} sector.",
        f"this annual report covers the year ended december 31, {year}.",
        "amounts in the table below are in millions of dollars, except per share data.",
        f"revenue was {fmt_prose('revenue', cur['revenue'])} in {year} compared with "
        f"{fmt_prose('revenue', prev['revenue'])} in {year - 1}.",
        rng.choice(_COLOUR),
    ]
    post_text = [
        f"research and development expense was {fmt_prose('r&d expense', cur['r&d expense'])} in {year} and "
        f"{fmt_prose('r&d expense', prev['r&d expense'])} in {year - 1}.",
        f"dividends paid to shareholders totaled {fmt_prose('dividends paid', cur['dividends paid'])} in {year} "
        f"compared with {fmt_prose('dividends paid', prev['dividends paid'])} in {year - 1}.",
        f"at december 31, {year}, the company had approximately {fmt_prose('employees', cur['employees'])} employees "
        f"( {fmt_prose('employees', prev['employees'])} in {year - 1} ).",
        f"diluted eps is based on {int(cur['diluted shares'])} million weighted average diluted shares.",
    ]
    for key in TEXT_FACTS:
        facts[(key, year)] = cur[key]
        facts[(key, year - 1)] = prev[key]
    page = 30 + (company.index * 7 + year) % 60
    return Report(f"{company.ticker}/{year}/page_{page}.pdf", company, year, pre_text, post_text, table, facts)


@dataclass
class Corpus:
    seed: int
    companies: list[Company]
    reports: dict[str, Report]  # doc_id -> report, in (company, year) order

    @classmethod
    def generate(cls, seed: int = 0, n_companies: int = 240) -> Corpus:
        companies = _companies(seed, n_companies)
        reports: dict[str, Report] = {}
        for company in companies:
            rng = random.Random(f"finqa-lite:{seed}:company:{company.index}")
            series = _series(rng, company.sector)
            for year in REPORT_YEARS:
                r = _report(company, year, series, rng)
                reports[r.doc_id] = r
        return cls(seed, companies, reports)

    def __post_init__(self) -> None:
        self._by_key = {(r.company.name, r.year): r for r in self.reports.values()}

    def report(self, company: str, year: int) -> Report:
        try:
            return self._by_key[(company, year)]
        except KeyError:
            raise KeyError(f"no finqa-lite report for {company!r} {year}") from None

    def records(self) -> list[dict[str, Any]]:
        """All reports as FinQA records."""
        return [r.to_record() for r in self.reports.values()]
