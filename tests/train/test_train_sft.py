"""Filtered SFT: the loss is the hand-computed mean NLL of assistant tokens only, however the step is split;
a resumed run equals an uninterrupted one; bad input is refused before anything trains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fakes_train as F
import pytest
import torch
from conftest import tiny_llama

from agentrft.inputs import InputError
from agentrft.store import Store
from agentrft.train import train
from agentrft.train.config import OptimizerConfig
from agentrft.train.config.check import check_references
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.train.core.packing import PackedSequence, micro_batches
from agentrft.train.core.shared_prefix import shared_prefix_micro_batches
from agentrft.train.data.records import RecordError
from agentrft.train.data.sft import sft_update
from agentrft.types import Grade, Message, TokenRecord, Trajectory

HERE = Path(__file__).parent

# Hand-built sequences with the role of every token: S system, U user, A assistant (the loss tokens), T tool.
# The first two share their system prompt and question (a prefix tree packs them into one row).
SEQUENCES = [
    ("SSSSUUUAAATTAAAA", [3, 9, 4, 4, 7, 11, 2, 50, 51, 52, 60, 61, 53, 54, 55, 1]),
    ("SSSSUUUAATTTAA", [3, 9, 4, 4, 7, 11, 2, 50, 58, 62, 63, 64, 70, 71]),
    ("SSSSUUAAAAA", [3, 9, 4, 4, 8, 12, 80, 81, 82, 83, 1]),
    ("SSSUA", [3, 9, 5, 13, 90]),
]
N_ASSISTANT = sum(roles.count("A") for roles, _ in SEQUENCES)


def _seqs() -> list[PackedSequence]:
    out = []
    for i, (roles, ids) in enumerate(SEQUENCES):
        assert len(roles) == len(ids)
        mask = [int(r == "A") for r in roles]
        out.append(PackedSequence(i, ids, mask, [0.0] * len(ids), [float(m) for m in mask]))
    return out


def _sgd_step(model, batches):
    # SGD with lr 1: the parameter change is exactly minus the gradient (see test_train_update)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    m = sft_update(model, opt, sched, batches, OptimizerConfig(grad_clip=1e9, logprob_chunk=5))
    return [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)], m


def _hand_nll(model) -> float:
    """Mean over every assistant token of every sequence of -log softmax(logits)[token], one sequence at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for roles, ids in SEQUENCES:
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # (T, V)
            log_probs = logits - logits.logsumexp(-1, keepdim=True)
            for t in range(1, len(ids)):
                if roles[t] == "A":
                    total -= float(log_probs[t - 1, ids[t]])
                    count += 1
    assert count == N_ASSISTANT == 17
    return total / count


def test_sft_loss_is_the_hand_computed_mean_nll_however_the_step_is_split():
    want = _hand_nll(tiny_llama())
    seqs = _seqs()
    one_each = micro_batches(seqs, max_tokens=1)
    together = micro_batches(seqs, max_tokens=10_000)
    assert len(one_each) == 4 and len(together) == 1
    d_each, m_each = _sgd_step(tiny_llama(), one_each)
    d_all, m_all = _sgd_step(tiny_llama(), together)
    assert m_each["loss"] == pytest.approx(want, rel=1e-12)
    assert m_all["loss"] == pytest.approx(want, rel=1e-12)
    assert m_all["nll"] == pytest.approx(want, rel=1e-12) and m_all["train_tokens"] == N_ASSISTANT
    assert any(float(d.abs().max()) > 1e-6 for d in d_all)
    for a, b in zip(d_each, d_all, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # prefix trees: the shared system prompt and question run once; same loss and update (Llama's RMSNorm
    # computes in fp32 even in an fp64 model, so to fp32 rounding; see test_train_shared_prefix)
    tree = shared_prefix_micro_batches(seqs, max_tokens=10_000, row_tokens=10_000)
    assert tree[0].num_forward_tokens < sum(len(s) for s in seqs)
    d_tree, m_tree = _sgd_step(tiny_llama(), tree)
    assert m_tree["loss"] == pytest.approx(want, rel=1e-6)
    for a, b in zip(d_tree, d_all, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max()) + 1e-12)


def test_only_assistant_tokens_are_learned_the_gradient_at_every_other_position_is_exactly_zero():
    """The hidden state at position t is what the LM head reads to predict token t+1. Its gradient is
    W^T (softmax(W h_t) - onehot(x_{t+1})) / N where x_{t+1} is an assistant token (N: the step's assistant
    tokens) and exactly 0 where x_{t+1} is a system, user or tool token, or padding: nothing is learned
    about predicting those. (Their input embeddings do get gradient: assistant tokens attend to them.)"""
    model = tiny_llama()
    captured = []

    def keep_grad(module, inputs, output):
        output.retain_grad()
        captured.append(output)

    handle = model.model.norm.register_forward_hook(keep_grad)
    try:
        batches = micro_batches(_seqs(), max_tokens=10_000)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        sft_update(
            model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), batches, OptimizerConfig(grad_clip=1e9)
        )
    finally:
        handle.remove()
    (h,) = captured
    mb = batches[0]
    grad = h.grad  # (B, T, H)
    w = model.get_output_embeddings().weight.detach()  # (V, H)
    want = torch.zeros_like(grad)
    for row, seq_index in enumerate(mb.seq_index):
        roles, ids = SEQUENCES[seq_index]
        for t in range(len(ids) - 1):
            if roles[t + 1] == "A":
                p = torch.softmax(w @ h[row, t].detach(), dim=-1)
                p[ids[t + 1]] -= 1.0
                want[row, t] = w.T @ p / N_ASSISTANT
    learned = want.abs().sum(-1) > 0  # (B, T): positions that predict an assistant token
    assert int(learned.sum()) == N_ASSISTANT
    assert torch.count_nonzero(grad[~learned]) == 0  # system, user, tool targets and padding: exactly 0
    torch.testing.assert_close(grad, want, rtol=1e-9, atol=1e-15)


# ---------------------------------------------------------------- the method end to end on fakes


def _run(run_dir, data, resume=False, stop_after=None, **over):
    return train(
        F.sft_config(data, **over), run_dir, resume=resume, components=F.components(run_dir), stop_after=stop_after
    )


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return F.write_sft_store(tmp_path_factory.mktemp("data") / "recorded.db")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("ref")
    return d, _run(d, data, steps=12)


def test_sft_run_logs_its_data_and_learns(reference, data):
    d, res = reference
    rows = read_metrics(d)
    assert [r["step"] for r in rows] == list(range(1, 13)) and res.steps == 12
    first = rows[0]
    # 8 recorded successes + 2 token-less chats rendered through the policy's template; 3 per step
    assert first["sft/examples"] == 10 and first["sft/rendered_trajectories"] == 2
    assert first["train_sequences"] == 3 and [r["sft/epoch"] for r in rows][-1] == pytest.approx(3.6)
    for key in ("loss", "nll", "entropy", "grad_norm", "lr", "train_tokens", "train_forward_tokens"):
        assert key in first, key
    assert first["train_forward_tokens"] < first["train_sequence_tokens"]  # the system prompt runs once per row
    losses = [r["loss"] for r in rows]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses
    with Store(d / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        assert run.status == "complete"
        assert run.metadata["sft"]["rendered_trajectories"] == 2
        assert run.metadata["sft"]["selection"]["success_only"] == 10
    assert (d / "policy" / "config.json").exists()


def test_stop_and_resume_equals_uninterrupted(reference, data, tmp_path):
    ref_dir, _ = reference
    _run(tmp_path, data, stop_after=5, steps=12)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]
    _run(tmp_path, data, resume=True, steps=12)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))


def test_kill_9_then_resume_equals_uninterrupted(reference, data, tmp_path):
    ref_dir, _ = reference
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "resume_worker_sft.py"), str(tmp_path), str(data)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not (tmp_path / "checkpoints" / "step-00000004").exists():
        assert proc.poll() is None, "worker ended before its fourth checkpoint"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (tmp_path / "policy").exists()  # killed mid-run, not finished
    _run(tmp_path, data, resume=True, steps=12)
    assert _strip(read_metrics(tmp_path)) == _strip(read_metrics(ref_dir))


# ---------------------------------------------------------------- bad input: one clear error, nothing trained


def _nothing_trained(run_dir: Path) -> None:
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "checkpoints").exists()
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "policy").exists()
    if (run_dir / "agentrft.db").exists():
        with Store(run_dir / "agentrft.db") as s:
            assert s.list_runs() == []


def test_an_empty_selection_names_the_filter_and_nothing_is_written(data, tmp_path):
    run_dir = tmp_path / "run"
    cfg = F.sft_config(data, **{"data.tasks": "[t3, t7]"})  # both failed: success_only leaves nothing
    with pytest.raises(
        InputError, match=r"^data: no trajectory of .*recorded.db is left after the 'success_only' filter"
    ):
        train(cfg, run_dir)
    assert not run_dir.exists()
    real_env = {"rollout.env": "finqa-lite:1"}  # check_references resolves the environment by name
    with pytest.raises(InputError, match=r"^c.yaml: data: no trajectory .* 'success_only' filter"):
        check_references(F.sft_config(data, **{"data.tasks": "[t3, t7]"}, **real_env), "c.yaml")
    with pytest.raises(InputError, match=r"^c.yaml: data.source: method sft learns from recorded trajectories"):
        check_references(F.sft_config(data, **{"data.source": "null"}, **real_env), "c.yaml")


def _bad(tokens: TokenRecord) -> Trajectory:
    return Trajectory(
        run_id="rec",
        task_id="bad",
        messages=[
            Message(role="system", content="s"),
            Message(role="user", content="q"),
            Message(role="assistant", content="a"),
            Message(role="user", content="more?"),
            Message(role="assistant", content="b"),
        ],
        n_prompt_messages=2,
        tokens=tokens,
        grade=Grade(reward=1.0, success=True),
    )


@pytest.mark.parametrize(
    ("ids", "mask", "turn", "why"),
    [
        ([1, 2, 3, 4, 5], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1], "its token record has 1 runs of sampled tokens but its messages have 2 assistant turns after the 2 prompt messages"),
        ([1, 2, 3, 4, 5], [1, 0, 1, 0, 1], [0, 0, 0, 1, 1], "its first token is marked sampled; a record starts with the prompt"),
        ([1, 2, 3, 4, 5], [0, 1, 0, 0, 1], [0, 1, 1, 1, 1], "sampled tokens 1..1 belong to assistant turn 0 but carry turn [1]"),
        ([1, 2, 3, 4, 5], [0, 1, 0, 0, 1], [0, 0, 1, 0, 1], "tokens.turn decreases at token 3 (1 -> 0)"),
        ([1, 2, 3, 99, 5], [0, 1, 0, 0, 1], [0, 0, 1, 1, 1], "token 3 has id 99, outside [0, 61) (recorded with another tokenizer?)"),
    ],
)  # fmt: skip
def test_a_token_record_that_disagrees_with_its_messages_is_refused_by_id(tmp_path, ids, mask, turn, why):
    source = tmp_path / "bad.db"
    F.write_sft_store(source, n=4, tokenless=0)
    bad = _bad(TokenRecord(ids=ids, loss_mask=mask, logprobs=[0.0] * 5, turn=turn))
    with Store(source) as s:
        s.add_trajectory(bad)
    run_dir = tmp_path / "run"
    with pytest.raises(RecordError) as exc:
        train(F.sft_config(source), run_dir, components=F.components(run_dir))
    assert str(exc.value) == f"data: trajectory {bad.id}: {why}"
    _nothing_trained(run_dir)
    if "outside" not in why:  # the config check knows no vocabulary until it loads a tokenizer to render
        with pytest.raises(InputError) as exc:
            check_references(F.sft_config(source, **{"rollout.env": "finqa-lite:1"}), "c.yaml")
        assert str(exc.value) == f"c.yaml: data: trajectory {bad.id}: {why}"


def test_a_trajectory_without_an_assistant_turn_is_refused_by_id(tmp_path):
    source = tmp_path / "bad.db"
    F.write_sft_store(source, n=2, tokenless=0)
    empty = Trajectory(
        run_id="rec",
        task_id="x",
        messages=[Message(role="user", content="q")],
        n_prompt_messages=1,
        grade=Grade(reward=1.0, success=True),
    )
    with Store(source) as s:
        s.add_trajectory(empty)
    run_dir = tmp_path / "run"
    with pytest.raises(RecordError, match=rf"^data: trajectory {empty.id}: no assistant turn after its 1 prompt"):
        train(F.sft_config(source), run_dir, components=F.components(run_dir))
    _nothing_trained(run_dir)


def test_sft_trains_the_policys_own_distribution_the_first_nll_is_the_samplers_logprob(tmp_path):
    """Log-probs at temperature 1: before any update, the NLL of episodes the policy sampled at T = 1 is minus
    the mean log-prob the sampler reported for them (fp32 both sides)."""
    recorded = tmp_path / "grpo"
    train(F.config(steps=1, **{"eval.every_steps": 0}), recorded, components=F.components(recorded))
    with Store(recorded / "agentrft.db") as s:
        trajs = [t for t in s.query_trajectories() if t.policy_version == 0]
    assert len(trajs) == 6
    sampled = [lp for t in trajs for lp, m in zip(t.tokens.logprobs, t.tokens.loss_mask, strict=True) if m]
    cfg = F.sft_config(
        recorded / "agentrft.db",
        **{"data.success_only": "false", "data.dedupe": "false", "data.policy_versions": "[0]", "sft.batch_size": 6},
    )
    res = train(cfg, tmp_path / "sft", components=F.components(tmp_path / "sft"), stop_after=1)
    first = res.history[0]
    assert first["train_tokens"] == len(sampled) == 36
    assert first["nll"] == pytest.approx(-sum(sampled) / len(sampled), abs=1e-5)


def test_prompt_groups_key_the_opening_of_the_prompt_not_the_question():
    from agentrft.envs.registry import make_env
    from agentrft.train.data.sft import prompt_groups

    env = make_env("finqa-lite:1,2,3")
    tasks = [t for t in env.tasks("train") if t.data["level"] in (2, 3)][::150]  # levels 2, 2, 3, 3
    trajs = []
    for task in tasks:
        prompt = env.initial_messages(task)
        trajs.append(
            Trajectory(messages=[*prompt, Message(role="assistant", content="x")], n_prompt_messages=len(prompt))
        )
    assert trajs[0].messages[-2].content != trajs[1].messages[-2].content  # different questions
    assert prompt_groups(trajs) == [0, 0, 1, 1]  # same level: same system prompt and worked example
    assert prompt_groups([Trajectory(messages=[Message(role="user", content=q)]) for q in "ab"]) == [0, 0]
