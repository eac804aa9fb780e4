"""DPO on the training core: packed pairs equal per-sequence runs, log 2 at initialisation, a resumed
run equals an uninterrupted one (the reference cache reused), it learns, and bad input is refused
before any model loads."""

from __future__ import annotations

import json
import math
import random
import shutil

import fakes_dpo as D
import fakes_train as F
import pytest
import torch
from conftest import VOCAB, tiny_llama

from agentrft.algos import preference_loss
from agentrft.inputs import InputError
from agentrft.samplers.distribution import Distribution
from agentrft.store import Store
from agentrft.train import ConfigError, train
from agentrft.train.core.logprobs import sampled_logprobs
from agentrft.train.core.metrics import is_timing_key, read_metrics
from agentrft.train.core.shared_prefix import common_prefix_len
from agentrft.train.data import dpo as DPO
from agentrft.train.data.preference_data import PairTokens, encode_pair, load_pairs, pair_sides
from agentrft.types import Run

GRAD_RTOL = 1e-5  # as in test_train_shared_prefix.py: shared tokens' gradients are summed in another order


def _strip(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _run(run_dir, source, *, resume=False, stop_after=None, **over):
    return train(
        D.config(str(source), **over),
        run_dir,
        resume=resume,
        components=_policy_only(),
        stop_after=stop_after,
    )


def _policy_only():
    """`train` dispatches method dpo with the components' sampler as the policy (env and grader unused)."""
    from agentrft.train import Components

    return Components(env=F.FakeEnv(), sampler=F.FakeSampler(), grader=F.FakeGrader())


@pytest.fixture
def db(tmp_path):
    return D.make_store(tmp_path / "data.db")


# ---------------------------------------------------------------- packing


def _random_pairs(seed: int = 0, n: int = 6) -> list[PairTokens]:
    """Pairs with prompts of their own, two pairs sharing one prompt, multi-turn sides (tool tokens unmasked)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 9))] for _ in range(n - 1)]
    prompts.append(prompts[0])
    out = []
    for k, prompt in enumerate(prompts):

        def side(prompt=prompt):
            ids, mask = list(prompt), [0] * len(prompt)
            for turn in range(rng.randint(1, 2)):
                if turn:
                    tool = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))]
                    ids, mask = ids + tool, mask + [0] * len(tool)
                sampled = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))]
                ids, mask = ids + sampled, mask + [1] * len(sampled)
            return ids, mask

        (ci, cm), (ri, rm) = side(), side()
        out.append(PairTokens(f"p{k}", ci, cm, ri, rm, False))
    return out


def _per_sequence(model, ids, mask):
    t = torch.tensor([ids])
    lp, _ = sampled_logprobs(
        model, t, torch.ones_like(t), torch.tensor([mask]), chunk_size=5, with_entropy=False, dist=Distribution()
    )
    return lp.sum()


def test_packed_pairs_equal_per_sequence_logprobs_and_gradients(tmp_path):
    model = tiny_llama(dtype=torch.float64)
    pairs = _random_pairs()
    cfg = D.config("x.db", **{"optimizer.micro_batch_tokens": 48, "optimizer.shared_prefix_row_tokens": 30})
    batches = DPO.pack_pairs(pairs, cfg, pad_id=0)
    assert len(batches) > 2
    for mb in batches:  # both members of every pair in one micro-batch, packed as a prefix tree
        assert mb.shared is not None and all(i ^ 1 in mb.seq_index for i in mb.seq_index)
    # each pair's prompt runs once: never more packed tokens than the pairs' tries
    tries = sum(
        len(p.chosen_ids) + len(p.rejected_ids) - common_prefix_len(p.chosen_ids, p.rejected_ids) for p in pairs
    )
    assert sum(mb.num_forward_tokens for mb in batches) <= tries

    rng = random.Random(1)
    ref_c = torch.tensor([-rng.uniform(1, 9) for _ in pairs], dtype=torch.float64)
    ref_r = torch.tensor([-rng.uniform(1, 9) for _ in pairs], dtype=torch.float64)

    def loss_of(pc, pr, g, nc, nr):
        return preference_loss("sigmoid", pc, pr, ref_c[g], ref_r[g], beta=0.7, chosen_tokens=nc, rejected_tokens=nr)[0]

    params = [p for p in model.parameters()]
    packed_lp = {}
    total = torch.zeros((), dtype=torch.float64)
    for mb in batches:
        seq, counts = DPO.sequence_logprobs(model, mb, chunk=5, precision=None)
        ks, c, r = pair_sides(mb)
        total = total + loss_of(seq[c], seq[r], torch.tensor(ks), counts[c], counts[r]).sum()
        for row, i in enumerate(mb.seq_index):
            packed_lp[i] = float(seq[row].detach())
    packed_grads = torch.autograd.grad(total, params)

    alone = []
    for k, p in enumerate(pairs):
        c, r = _per_sequence(model, p.chosen_ids, p.chosen_mask), _per_sequence(model, p.rejected_ids, p.rejected_mask)
        assert packed_lp[2 * k] == pytest.approx(float(c.detach()), abs=1e-10, rel=0)
        assert packed_lp[2 * k + 1] == pytest.approx(float(r.detach()), abs=1e-10, rel=0)
        n = lambda m: torch.tensor([float(sum(m))], dtype=torch.float64)  # noqa: E731
        alone.append(loss_of(c[None], r[None], torch.tensor([k]), n(p.chosen_mask), n(p.rejected_mask)))
    alone_grads = torch.autograd.grad(torch.cat(alone).sum(), params)
    assert float(total) == pytest.approx(float(torch.cat(alone).sum()), abs=1e-10, rel=0)
    for a, b in zip(packed_grads, alone_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=GRAD_RTOL, atol=1e-6 * float(b.abs().max()) + 1e-12)


# ---------------------------------------------------------------- initialisation, resume, learning


def test_every_pair_loss_is_log2_at_initialisation(db):
    cfg = D.config(str(db))
    policy = F.FakeSampler()
    pairs, _ = load_pairs(None, cfg.data, margin=cfg.dpo.margin, per_task=cfg.dpo.pairs_per_task)
    encoded = [encode_pair(p, policy, "xml", []) for p in pairs]
    ref_c, ref_r = DPO.reference_pass(policy.model, encoded, cfg, 0, None)
    policy.model.train()
    seen = 0
    for idx in DPO.epoch_batches(len(encoded), cfg.dpo.pairs_per_step, cfg.seed):
        for mb in DPO.pack_pairs([encoded[i] for i in idx], cfg, 0):  # as the steps of the first epoch pack them
            seq, counts = DPO.sequence_logprobs(policy.model, mb, chunk=1024, precision=None)
            ks, c, r = pair_sides(mb)
            g = torch.tensor([idx[k] for k in ks])
            for name in ("sigmoid", "sigmoid_norm"):
                losses, _ = preference_loss(
                    name,
                    seq[c],
                    seq[r],
                    ref_c[g],
                    ref_r[g],
                    beta=0.5,
                    chosen_tokens=counts[c],
                    rejected_tokens=counts[r],
                )
                assert losses.tolist() == [math.log(2)] * len(ks)
            seen += len(ks)
    assert seen == len(encoded) == 16  # 4 tasks of 4 samples: every task has two successes over two failures


@pytest.mark.parametrize(("finetune", "precision"), [("full", "fp32"), ("lora", "fp32"), ("full", "bf16")])
def test_step_one_logs_log2_and_no_margin(db, tmp_path, finetune, precision):
    # exactly log 2, also under bf16 autocast: the reference pass packed step 1's batch as step 1 does
    res = _run(tmp_path / "run", db, steps=1, **{"policy.finetune": finetune, "policy.precision": precision})
    first = res.history[0]
    assert first["loss"] == math.log(2) and first["rewards/margin"] == 0.0 and first["rewards/accuracy"] == 0.0
    assert first["logps/chosen"] < 0 and first["train_pairs"] == 3 and first["data/pairs"] == 16
    assert first["data/pairs_rendered"] == 0  # token records used as recorded


def test_resume_equals_uninterrupted_and_reuses_the_reference(db, tmp_path, monkeypatch):
    calls = []
    real = DPO.reference_pass

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(DPO, "reference_pass", counted)
    _run(tmp_path / "a", db)
    assert calls == [1]
    _run(tmp_path / "b", db, stop_after=2)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [1, 2]
    cache = (tmp_path / "b" / DPO.REFERENCE_NAME).stat().st_mtime_ns
    _run(tmp_path / "b", db, resume=True)
    assert calls == [1, 1]  # the resumed run computed no reference: the cache of its first start was reused
    assert (tmp_path / "b" / DPO.REFERENCE_NAME).stat().st_mtime_ns == cache
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == [1, 2, 3, 4] and _strip(b) == _strip(a)
    assert {"loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin", "epoch"} <= set(a[0])
    from safetensors.torch import load_file

    sa, sb = (
        load_file(tmp_path / "a" / "policy" / "model.safetensors"),
        load_file(tmp_path / "b" / "policy" / "model.safetensors"),
    )
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with Store(tmp_path / "b" / "agentrft.db") as s:
        run = next(r for r in s.list_runs() if r.kind == "train")
        assert run.status == "complete" and [m["step"] for m in s.get_metrics(run.id)] == [1, 2, 3, 4]
    assert json.loads((tmp_path / "b" / DPO.PAIRS_NAME).read_text().splitlines()[0])["chosen"][0]["role"] == "assistant"


def test_resume_refuses_a_reference_of_other_pairs(db, tmp_path):
    _run(tmp_path / "run", db, stop_after=1)
    rng = random.Random(7)
    with Store(db) as s:  # the store gained episodes since the run started: other pairs
        for k in range(4):
            s.add_trajectory(D.episode(rng, 9, k))
    with pytest.raises(ConfigError, match="reference log-probs of other pairs than these"):
        _run(tmp_path / "run", db, resume=True)


@pytest.mark.parametrize(
    ("loss", "beta", "lr"), [("sigmoid", 0.5, 1e-2), ("ipo", 0.5, 3e-3), ("sigmoid_norm", 2.0, 1e-2)]
)
def test_it_learns_the_preference(db, tmp_path, loss, beta, lr):
    over = {"dpo.loss": loss, "dpo.beta": beta, "optimizer.lr": lr, "optimizer.schedule": "constant"}
    res = _run(tmp_path / loss, db, steps=16, **over)
    last = res.history[-8:]
    mean = lambda k: sum(r[k] for r in last) / len(last)  # noqa: E731
    # IPO regresses h onto 1/(2 beta), so it overshoots and comes back: judged over the last 8 steps
    assert mean("rewards/accuracy") >= 0.85 and mean("rewards/margin") > 0
    assert mean("loss") < 0.6 * res.history[0]["loss"]
    assert res.history[-1]["epoch"] == 3.0  # 16 steps x 3 pairs over 16 pairs


# ---------------------------------------------------------------- bad input: refused before any model loads


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model at all fails the test: every refusal must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("agentrft.samplers.policies.load_trainable_policy", refuse)


def _refused(tmp_path, match, **over):
    cfg = D.config(**over)
    with pytest.raises(InputError, match=match):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_empty_selection_is_refused(db, tmp_path, no_model):
    _refused(
        tmp_path,
        r"no trajectory of .*data.db is left after the 'tasks' filter",
        source=str(db),
        **{"data.tasks": "[nope]"},
    )


def test_no_pair_passing_the_margin_is_refused(db, tmp_path, no_model):
    _refused(
        tmp_path,
        r"data.source .*data.db: no pair .* reward gap >= margin 0.9 \(16 trajectories",
        source=str(db),
        **{"dpo.margin": 0.9},
    )


def test_a_pairs_line_without_a_field_is_refused(tmp_path, no_model):
    path = tmp_path / "pairs.jsonl"
    good = {"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}]}
    path.write_text(
        json.dumps({**good, "rejected": [{"role": "assistant", "content": "b"}]}) + "\n" + json.dumps(good) + "\n"
    )
    _refused(tmp_path, r"pairs.jsonl:2: field 'rejected': missing", pairs=str(path))


def test_one_source_of_pairs(db, tmp_path, no_model):
    _refused(tmp_path, r"name exactly one source of pairs", pairs=str(db), source=str(db))
    _refused(tmp_path, r"name exactly one source of pairs")


def test_tokens_that_disagree_with_the_messages_are_refused(tmp_path, no_model):
    path = D.make_store(tmp_path / "data.db")
    with Store(path) as s:
        t = D.episode(random.Random(3), 0, 9)
        t.messages = t.messages[:2] + t.messages[-1:]  # one assistant turn left; the tokens hold two
        t.grade = t.grade.model_copy(update={"reward": 1.0})
        s.add_trajectory(t)
    _refused(
        tmp_path,
        rf"trajectory {t.id}: field 'tokens': its token record has 2 runs of sampled tokens but its messages have 1 assistant turn",
        source=str(path),
    )


def test_same_prompt_different_prompt_tokens_are_refused(tmp_path, no_model):
    path = tmp_path / "data.db"
    rng = random.Random(0)
    with Store(path) as s:
        s.add_run(Run(id="r-train", name="train", kind="train"))
        a, b = D.episode(rng, 0, 0), D.episode(rng, 0, 1)
        b.tokens.ids[0] = 2  # same prompt messages, another first token
        a.grade, b.grade = a.grade.model_copy(update={"reward": 1.0}), b.grade.model_copy(update={"reward": 0.0})
        s.add_trajectory(a)
        s.add_trajectory(b)
    _refused(
        tmp_path,
        r"field 'tokens.ids': same prompt messages but different prompt tokens \(from token 0\)",
        source=str(path),
    )


def test_pairs_from_a_file_are_rendered_and_say_so(tmp_path, db):
    # the store's pairs, exported as a TRL file, then trained on: no token records, so rendered
    pairs, _ = load_pairs(None, D.config(str(db)).data, margin=0.1, per_task=4)
    from agentrft.pairs import write_pairs

    write_pairs(pairs, tmp_path / "pairs.jsonl")
    res = train(D.config(pairs=str(tmp_path / "pairs.jsonl"), steps=2), tmp_path / "run", components=_policy_only())
    assert res.history[0]["data/pairs_rendered"] == res.history[0]["data/pairs"] == 16
    assert res.history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    shutil.rmtree(tmp_path / "run")


def test_the_config_names_every_registered_loss():
    from typing import get_args

    from agentrft.algos import PREFERENCE_LOSSES
    from agentrft.train.config import DPOConfig

    assert set(get_args(DPOConfig.model_fields["loss"].annotation)) == set(PREFERENCE_LOSSES)


def test_the_step_hook_reaches_dpo_and_can_stop_it_at_a_checkpoint(db, tmp_path):
    seen = []

    def hook(step, metrics):
        seen.append((step, "loss" in metrics))
        return step == 2  # a cancel request, as `agentrft rft cancel` makes one

    res = train(D.config(str(db), steps=4), tmp_path / "run", components=_policy_only(), on_step=hook)
    assert seen == [(1, True), (2, True)] and res.steps == 2
    assert (tmp_path / "run" / "checkpoints" / "step-00000002").exists()
