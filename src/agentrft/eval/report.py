"""One self-contained HTML report of a run directory.

RUN_DIR layout::

    RUN_DIR/agentrft.db      the store: runs, trajectories, step metrics (required)
    RUN_DIR/metrics.jsonl    optional step metrics, one JSON object per line with a "step" key;
                             when present it is used instead of the store's step metrics

The report holds: reward and pass@k curves over training steps, per grader too
(``train_reward/<grader>``, ``valid_reward/<grader>``: each sub-grader of a ``multi``), and, for the
methods that learn from recorded trajectories, the loss and the pairwise
accuracy/margin curves of DPO and the reward model; for asynchronous GRPO,
utilisation, queue depth, staleness, sync time and importance weights), a before/after
table (eval runs named "baseline" and "final", else the first and last eval run)
with the paired test, per-level bars, tool-use statistics, failure categories
and a trajectory browser (the before/after runs' trajectories, and the first
`SAMPLES_PER_EVAL` of every other eval run, e.g. each periodic eval of a training run). Charts are inline SVG drawn here; the browser is
vanilla JS over trajectories embedded as JSON. Nothing is fetched from the
network (a Content-Security-Policy forbids it) and all text is escaped: in
Python with `html.escape`, in the page with `textContent` only, and the embedded
JSON has `<`, `>` and `&` escaped so model output cannot close the script tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from agentrft.eval.charts import bar_chart, line_chart
from agentrft.eval.failures import classify_failure
from agentrft.eval.harness import EvalResult, result_from_run, summarize
from agentrft.eval.metrics import paired_test
from agentrft.step_metrics import read_step_metrics
from agentrft.store import RUN_STORE_NAME
from agentrft.types import Run, Trajectory

DB_NAME = RUN_STORE_NAME
METRICS_NAME = "metrics.jsonl"
_REWARD_KEY = re.compile(r"^((train|valid|eval)_)?reward_mean$")
_GRADER_KEY = re.compile(r"^(train|valid|eval)_reward/.+$")  # one curve per (sub-)grader
# success_rate is pass@1 of the step's samples (what the trainer logs); pass@k keys appear when evals log them
_CHECK_KEY = re.compile(r"^valid_check_reward$")  # train/rl/tripwires.py's check grader at the periodic evals
_PASS_KEY = re.compile(r"^((train|valid|eval)_)?(success_rate|pass(@|\^|_at_|_hat_)\d+)$")
# the loss every method logs; DPO's and the reward model's pairwise curves (train and held out)
_LOSS_KEY = re.compile(r"^(loss|rm/heldout_loss)$")
_PAIRWISE_KEY = re.compile(r"^(rewards/(accuracy|margin)|rm/(heldout_)?(accuracy|margin))$")
# asynchronous GRPO (train/rl/pipeline.py): utilisation, queue, staleness, weight sync; the off-policy correction
_ASYNC_KEY = re.compile(r"^async/(trainer_utilisation|producer_utilisation|queue_groups|staleness/(mean|max))$")
_SYNC_KEY = re.compile(r"^time/(sync_s|publish_s|wait_s)$")
_IS_KEY = re.compile(r"^is/(weight_mean|weight_max|truncated_frac|masked_frac)$")
# the curriculum's mix (train/rl/curriculum.py): draw weight and rolling pass rate per level
_MIX_KEY = re.compile(r"^curriculum/level_\d+_weight$")
_LEVEL_PASS_KEY = re.compile(r"^curriculum/level_\d+_pass_rate$")
_MAX_CHARS = 20_000
SAMPLES_PER_EVAL = 8


def read_metrics_jsonl(path: Path) -> list[dict[str, Any]]:
    """Step metrics from ``path``; a last line torn by an interrupted run is left out (see `step_metrics`)."""
    return read_step_metrics(path)[0]


def _step_metrics(store: Any, runs: Sequence[Run], run_dir: Path) -> list[dict[str, Any]]:
    if (run_dir / METRICS_NAME).exists():
        return read_metrics_jsonl(run_dir / METRICS_NAME)
    for run in reversed(runs):  # the latest run that logged step metrics
        rows = store.get_metrics(run.id)
        if rows:
            return rows
    return []


def _curves(rows: Sequence[dict[str, Any]], pattern: re.Pattern[str]) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if pattern.match(key) and isinstance(value, int | float) and not isinstance(value, bool):
                out.setdefault(key, []).append((float(row["step"]), float(value)))
    return dict(sorted(out.items()))


def pick_before_after(evals: Sequence[Run]) -> tuple[Run | None, Run | None]:
    """("baseline", "final") by name, else the first and last eval run (None when missing)."""
    by_name = {r.name: r for r in evals}
    before = by_name.get("baseline") or (evals[0] if evals else None)
    after = by_name.get("final") or (evals[-1] if len(evals) > 1 else None)
    if after is not None and before is not None and after.id == before.id:
        after = None
    return before, after


def _result(store: Any, run: Run) -> tuple[EvalResult, list[Trajectory]]:
    trajs = store.query_trajectories(run_id=run.id)
    if "result" in run.metadata:
        return result_from_run(run), trajs
    return summarize(trajs, _task_map(run), run_id=run.id, run_name=run.name), trajs


def _task_map(run: Run) -> dict[str, Any]:
    from agentrft.types import Task

    data = run.metadata.get("task_data") or {}
    return {tid: Task(id=tid, messages=[], data=d) for tid, d in data.items()}


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:,.4g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _delta(a: float | None, b: float | None, pct: bool, higher_is_better: bool = True) -> str:
    if a is None or b is None:
        return "–"
    d = b - a
    cls = "" if d == 0 else ("up" if (d > 0) == higher_is_better else "down")
    text = f"{d:+.1%}" if pct else f"{d:+,.4g}"
    return f'<span class="{cls}">{escape(text)}</span>'


def _before_after(results: list[tuple[str, EvalResult]]) -> str:
    if not results:
        return '<p class="empty">No eval run in this store.</p>'
    k = min(r.samples_per_task for _, r in results)
    metrics: list[tuple[str, Any, bool, bool]] = [
        ("tasks", lambda r: r.n_tasks, False, True),
        ("samples per task", lambda r: r.samples_per_task, False, True),
        ("success rate (pass@1)", lambda r: r.pass_at_k.get(1), True, True),
        (f"pass@{k}", lambda r: r.pass_at_k.get(k), True, True),
        (f"pass^{k}", lambda r: r.pass_hat_k.get(k), True, True),
        ("mean reward", lambda r: r.mean_reward, False, True),
        ("tool calls / episode", lambda r: r.tools.calls_per_episode, False, False),
        ("tool error rate", lambda r: r.tools.error_rate, True, False),
        ("tokens / episode", lambda r: r.usage.tokens_per_episode, False, False),
        ("latency s / episode", lambda r: r.usage.latency_s_mean, False, False),
        ("tokens / success", lambda r: r.cost.tokens_per_success, False, False),
        ("USD / success", lambda r: r.cost.usd_per_success, False, False),
    ]
    headers = ["metric", *(f"{name}" for name, _ in results)] + (["Δ"] if len(results) == 2 else [])
    rows = []
    for label, get, pct, better in metrics:
        vals = [get(r) for _, r in results]
        cells = [escape(label), *((_pct if pct else _num)(v) for v in vals)]
        if label == "mean reward":
            cells[1 : 1 + len(vals)] = [
                f'{_num(r.mean_reward)} <span class="kv">[{r.reward_ci[0]:.3f}, {r.reward_ci[1]:.3f}]</span>'
                for _, r in results
            ]
        if len(results) == 2:
            cells.append(_delta(vals[0], vals[1], pct, better))
        rows.append(cells)
    html = _table(headers, rows, "before-after")
    if len(results) == 2:
        try:
            cmp = paired_test(results[0][1].task_rates(), results[1][1].task_rates())
            html += (
                f'<p class="note">Paired comparison on {cmp.n_tasks} shared tasks: success rate '
                f"{cmp.diff:+.1%} (95% CI {cmp.ci[0]:+.1%} to {cmp.ci[1]:+.1%}), p = {cmp.p_value:.3g} "
                f"({escape(cmp.method)}); better on {cmp.wins_b}, worse on {cmp.wins_a}, "
                f"tied on {cmp.ties}.</p>"
            )
        except ValueError as e:
            html += f'<p class="note">No paired comparison: {escape(str(e))}.</p>'
    return html


def _level_and_failures(results: list[tuple[str, EvalResult]]) -> str:
    if not results:
        return ""
    levels = sorted({lv for _, r in results for lv in r.per_level}, key=lambda s: (len(s), s))
    lv_chart = bar_chart(
        "Success rate per curriculum level",
        levels,
        {name: [r.per_level[lv].success_rate if lv in r.per_level else 0.0 for lv in levels] for name, r in results},
        y_range=(0.0, 1.0),
        percent=True,
    )
    cats = [c for c in results[-1][1].failures if any(r.failures.get(c, 0) for _, r in results)]
    fail_chart = bar_chart(
        "Failure categories (first wrong step)",
        cats,
        {name: [float(r.failures.get(c, 0)) for c in cats] for name, r in results},
    )
    tools = sorted({t for _, r in results for t in r.tools.calls_per_episode_by_tool})
    tool_chart = bar_chart(
        "Tool calls per episode",
        tools,
        {name: [r.tools.calls_per_episode_by_tool.get(t, 0.0) for t in tools] for name, r in results},
    )
    pass_chart = line_chart(
        "pass@k and pass^k by k",
        {
            **{f"{name} pass@k": [(float(k), v) for k, v in r.pass_at_k.items()] for name, r in results},
            **{f"{name} pass^k": [(float(k), v) for k, v in r.pass_hat_k.items()] for name, r in results},
        },
        x_label="k",
        y_range=(0.0, 1.0),
    )
    err_rows = [
        [escape(name), escape(kind), str(n)] for name, r in results for kind, n in r.tools.errors_by_kind.items()
    ]
    fail_rows = [[escape(c), *(str(r.failures.get(c, 0)) for _, r in results)] for c in results[-1][1].failures]
    return (
        f'<section id="levels"><h2>Per-level success</h2><div class="charts">{lv_chart}{pass_chart}</div></section>'
        f'<section id="tools"><h2>Tool use</h2><div class="charts">{tool_chart}</div>'
        + (_table(["run", "tool error kind", "count"], err_rows) if err_rows else '<p class="note">No tool errors.</p>')
        + "</section>"
        f'<section id="failures"><h2>Failure categories</h2><div class="charts">{fail_chart}</div>'
        + _table(["category", *(name for name, _ in results)], fail_rows)
        + "</section>"
    )


def _exclusions(steps: list[dict[str, Any]]) -> str:
    """What left the training batches and why (errors never train: see train/stages.filter_stage)."""
    keys = sorted({k for row in steps for k in row if k.startswith(("excluded/", "groups_dropped/"))})
    if not steps:
        return ""
    trained = sum(float(row.get("train_sequences", 0.0)) for row in steps)
    if not keys:
        return f'<p class="note">Nothing was excluded from training ({trained:.0f} trajectories trained).</p>'
    rows = [
        [escape(k), f"{sum(float(row.get(k, 0.0)) for row in steps):.0f}", f"{sum(1 for row in steps if row.get(k)):d}"]
        for k in keys
    ]
    return (
        f'<h3>Excluded from training</h3><p class="note">{trained:.0f} trajectories trained; episode and grader '
        "errors are counted here, never trained on as reward 0.</p>"
        + _table(["cause", "count", "steps with any"], rows, "exclusions")
    )


def _staleness(steps: list[dict[str, Any]]) -> str:
    """How stale the trained trajectories were (asynchronous GRPO): ``async/staleness/k`` summed over the steps."""
    counts: dict[str, float] = {}
    for row in steps:
        for key, value in row.items():
            m = re.fullmatch(r"async/staleness/(\d+|over)", key)
            if m and isinstance(value, int | float):
                counts[m.group(1)] = counts.get(m.group(1), 0.0) + float(value)
    if not counts:
        return ""
    order = sorted(counts, key=lambda k: (k == "over", int(k) if k.isdigit() else 0))
    dropped = sum(float(row.get("async/dropped_stale", 0.0)) for row in steps)
    return (
        "<h3>Staleness of the trained trajectories</h3>"
        f'<p class="note">versions between the weights that sampled a trajectory and the update that used it; '
        f"{dropped:.0f} dropped for exceeding the bound.</p>"
        + _table(["staleness", "trajectories"], [[escape(k), f"{counts[k]:.0f}"] for k in order], "staleness")
    )


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_CHARS else text[:_MAX_CHARS] + f"… [{len(text) - _MAX_CHARS} more characters]"


def trajectory_view(t: Trajectory, run_name: str, task_data: dict[str, Any] | None) -> dict[str, Any]:
    """The compact JSON the browser renders for one trajectory."""
    turn, messages = 0, []
    for m in t.messages:
        item: dict[str, Any] = {"role": m.role, "content": _clip(m.text())}
        if m.role == "assistant":
            item["turn"] = turn
            turn += 1
        if m.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "name": c.function.name, "arguments": _clip(c.function.arguments)} for c in m.tool_calls
            ]
        messages.append(item)
    grade = (
        None
        if t.grade is None
        else {
            "reward": t.grade.reward,
            "success": t.grade.success,
            "sub_rewards": t.grade.sub_rewards,
            "turn_rewards": t.grade.turn_rewards,
            "errors": [e.model_dump() for e in t.grade.errors],
        }
    )
    return {
        "id": t.id,
        "run": run_name,
        "task_id": t.task_id,
        "policy": t.policy,
        "status": t.status,
        "reward": t.reward,
        "success": bool(t.grade and t.grade.success),
        "grade": grade,
        "failure": classify_failure(t, task_data),
        "final_answer": t.final_answer,
        "messages": messages,
        "tool_events": [
            {"call_id": c.call_id, "name": c.name, "error": c.error, "error_kind": c.error_kind} for c in t.tool_calls
        ],
    }


def _embed(obj: Any) -> str:
    return (
        json.dumps(obj, ensure_ascii=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _branches(store: Any, runs: Sequence[Run]) -> tuple[str, list[tuple[Trajectory, str, Any]]]:
    """`agentrft replay` runs: each original beside its branches (the turn, status, reward, final answer), and
    all of them for the trajectory browser."""
    rows: list[list[str]] = []
    browse: list[tuple[Trajectory, str, Any]] = []
    for run in runs:
        parent_id = (run.config or {}).get("branch_of")
        if not isinstance(parent_id, str):
            continue
        try:
            parent = store.get_trajectory(parent_id)
        except KeyError:  # NotFoundError: the original is in another store
            continue
        kids = store.query_trajectories(run_id=run.id)
        turn = escape(str((run.config or {}).get("turn")))
        for label, t in [("original", parent)] + [("branch", k) for k in kids]:
            reward = "–" if t.grade is None else f"{t.grade.reward:.3g}"
            answer = escape((t.final_answer or "")[:120])
            rows.append([label, f"<code>{escape(t.id[:12])}</code>", turn, escape(t.status), reward, answer])
        browse += [
            (t, f"{run.name or run.id} (original)" if t is parent else run.name or run.id, None)
            for t in (parent, *kids)
        ]
    if not rows:
        return "", []
    table = _table(["episode", "id", "branched at turn", "status", "reward", "final answer"], rows, "branches")
    return f'<section id="branches"><h2>Branches (agentrft replay)</h2>{table}</section>', browse


def build_report(run_dir: str | Path, *, max_trajectories: int = 2000) -> str:
    """The report HTML of ``run_dir`` (see the module docstring for the layout). Long because it reads the
    store once and hands each section what it needs, in the page's order: one straight line, no branches."""
    from agentrft.store import Store

    run_dir = Path(run_dir)
    db = run_dir / DB_NAME
    if not db.exists():
        raise FileNotFoundError(f"{db} not found: a run directory holds its store as {DB_NAME}")
    store = Store(db)
    try:
        runs = store.list_runs()
        evals = [r for r in runs if r.kind == "eval" and r.status == "complete"]
        unfinished = [r.name or r.id for r in runs if r.status == "incomplete"]
        before, after = pick_before_after(evals)
        chosen = [r for r in (before, after) if r is not None]
        results, browse = [], []
        for run in chosen:
            res, trajs = _result(store, run)
            results.append((run.name or run.id, res))
            task_data = run.metadata.get("task_data") or {}
            browse += [(t, run.name or run.id, task_data.get(t.task_id)) for t in trajs]
        for run in evals:  # a few episodes of every other eval (periodic evals during training)
            if run not in chosen:
                task_data = run.metadata.get("task_data") or {}
                sampled = store.query_trajectories(run_id=run.id, limit=SAMPLES_PER_EVAL)
                browse += [(t, run.name or run.id, task_data.get(t.task_id)) for t in sampled]
        if not chosen:  # no eval run: browse whatever the store holds (e.g. training rollouts)
            names = {r.id: r.name or r.id for r in runs}
            browse = [
                (t, names.get(t.run_id, t.run_id), None) for t in store.query_trajectories(limit=max_trajectories)
            ]
        steps = _step_metrics(store, runs, run_dir)
        branches, branched = _branches(store, runs)
        browse += branched
    finally:
        store.close()

    rewards, passes, per_grader = _curves(steps, _REWARD_KEY), _curves(steps, _PASS_KEY), _curves(steps, _GRADER_KEY)
    if check := _curves(steps, _CHECK_KEY):
        rewards.update(check)  # the tripwires' held-out check grader beside the training reward
    marks = [
        (float(row["step"]), f"tripwire {key.removeprefix('tripwire/')}")
        for row in steps
        for key in row
        if key.startswith("tripwire/")
    ]
    # SFT, DPO and the reward model log no rewards: their loss and pairwise curves take the reward curves' place
    method_charts = "".join(
        line_chart(title, curves)
        for title, curves in (
            ("Loss over training steps", _curves(steps, _LOSS_KEY)),
            ("Pairwise accuracy and margin over training steps", _curves(steps, _PAIRWISE_KEY)),
            ("Curriculum: share of draws per level", _curves(steps, _MIX_KEY)),
            ("Curriculum: rolling pass rate per level", _curves(steps, _LEVEL_PASS_KEY)),
            ("Asynchronous rollouts: utilisation, queued groups, staleness", _curves(steps, _ASYNC_KEY)),
            ("Trainer waiting for groups and weight sync (s)", _curves(steps, _SYNC_KEY)),
            ("Off-policy correction: behaviour importance weights", _curves(steps, _IS_KEY)),
        )
        if curves
    )
    charts = method_charts
    if rewards or passes or not method_charts:
        charts = (
            line_chart("Reward over training steps", rewards, marks=marks)
            + (line_chart("Reward per grader over training steps", per_grader) if per_grader else "")
            + line_chart("Success (pass@1) and pass@k over training steps", passes, y_range=(0.0, 1.0), marks=marks)
            + method_charts
        )
    body = (
        f'<section id="training"><h2>Training</h2><div class="charts">{charts}</div>'
        f'<p class="note">{len(steps)} logged steps.</p>{_exclusions(steps)}{_staleness(steps)}</section>'
        f'<section id="before-after"><h2>Before / after</h2>{_before_after(results)}</section>'
        + _level_and_failures(results)
        + branches
    )
    views = [trajectory_view(t, name, data) for t, name, data in browse[:max_trajectories]]
    payload = {"trajectories": views, "truncated": len(browse) > max_trajectories, "total": len(browse)}
    subtitle = f"{escape(str(run_dir))} · {len(runs)} runs · " + (
        " vs ".join(escape(n) for n, _ in results) if results else "no eval run"
    )
    if unfinished:  # killed midway (or still running): shown, never counted as results
        subtitle += " · incomplete: " + ", ".join(escape(n) for n in unfinished)
    template = resources.files("agentrft.eval").joinpath("report_template.html").read_text(encoding="utf-8")
    values = {
        "TITLE": escape(f"agentrft report — {run_dir.name}"),
        "SUBTITLE": subtitle,
        "BODY": body,
        "DATA": _embed(payload),
    }
    # one pass, so a marker-like string inside a value is never substituted again
    return re.sub(r"__(TITLE|SUBTITLE|BODY|DATA)__", lambda m: values[m.group(1)], template)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report (default ``RUN_DIR/report.html``) and return its path."""
    html = build_report(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    return path
