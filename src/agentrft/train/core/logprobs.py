"""Log-probs (and entropy) of the sampled tokens without materialising whole-batch logits.

A 135M model with a 49k vocabulary turns a 16k-token micro-batch into 3 GB of fp32
logits, and autograd would keep them for the backward. Instead: run the model body
once for hidden states, keep only the positions whose *next* token is a sampled
one (``loss_mask``), and apply ``lm_head`` + log_softmax + gather per chunk of
``chunk_size`` positions. Each chunk runs under ``torch.utils.checkpoint`` so the
backward recomputes one chunk's logits at a time instead of storing them all.

Shape legend: B = sequences, T = tokens (right-padded), H = hidden size,
M = number of sampled tokens in the batch, V = vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from agentrft.samplers.distribution import Distribution, entropy
from agentrft.train.config import LOGPROB_CHUNK


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder body (hidden states) and the output projection, through a peft wrapper if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    return body, base.get_output_embeddings()


def _chunk_logprobs(
    head: Any, hidden: Tensor, targets: Tensor, with_entropy: bool, dist: Distribution
) -> tuple[Tensor, Tensor]:
    """(M_c,) log-probs of ``targets`` under ``dist.warp(head(hidden))``, and (M_c,) entropy (no grad)."""
    logits = head(hidden)
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()  # log_softmax in fp32 even under bf16 autocast
    logp_all = torch.log_softmax(dist.warp(logits, keep=targets), dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if with_entropy:
        with torch.no_grad():
            ent = entropy(logp_all)
    else:
        ent = torch.zeros_like(logp).detach()
    return logp, ent


def sampled_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    loss_mask: Tensor,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    with_entropy: bool = True,
    use_checkpoint: bool = True,
    dist: Distribution = Distribution(),
) -> tuple[Tensor, Tensor]:
    """Per-token log-prob and entropy (B, T) aligned with ``input_ids``; 0 where ``loss_mask`` is 0.

    ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` for sampled tokens
    (``loss_mask[b, t] == 1``); ``loss_mask[:, 0]`` must be 0 (a first token has no
    context). Gradients flow into the log-probs; entropy is a detached metric.
    ``dist`` is the sampling distribution (temperature, top-k, top-p) the rollout drew
    from: the policy being trained is that one, and its log-probs are what the
    sampler reported (`agentrft.samplers.distribution`).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if input_ids.shape != loss_mask.shape or input_ids.shape != attention_mask.shape:
        raise ValueError("input_ids, attention_mask and loss_mask must have the same shape (B, T)")
    if bool(loss_mask[:, 0].any()):
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no context to be sampled from")
    body, head = _body_and_head(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, H)
    b_idx, t_idx = loss_mask[:, 1:].nonzero(as_tuple=True)  # token t+1 is predicted from position t
    return head_logprobs(
        head,
        hidden[b_idx, t_idx],
        input_ids,
        b_idx,
        t_idx,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        use_checkpoint=use_checkpoint,
        dist=dist,
    )


def head_logprobs(
    head: Any,
    h: Tensor,
    input_ids: Tensor,
    b_idx: Tensor,
    t_idx: Tensor,
    *,
    chunk_size: int,
    with_entropy: bool,
    use_checkpoint: bool,
    dist: Distribution,
) -> tuple[Tensor, Tensor]:
    """Chunked ``lm_head`` on the M predicting hidden states ``h`` (M, H); token ``input_ids[b_idx, t_idx + 1]``
    is the target of ``h[m]``. Returns (B, T) log-prob and entropy, 0 elsewhere (shared with `shared_prefix`)."""
    targets = input_ids[b_idx, t_idx + 1]  # (M,)
    lps: list[Tensor] = []
    ents: list[Tensor] = []
    for start in range(0, targets.shape[0], chunk_size):
        hc, tc = h[start : start + chunk_size], targets[start : start + chunk_size]
        if use_checkpoint and torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_logprobs, head, hc, tc, with_entropy, dist, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(head, hc, tc, with_entropy, dist)
        lps.append(lp)
        ents.append(ent)
    shape = input_ids.shape
    dtype = lps[0].dtype if lps else torch.float32  # fp32, or fp64 for a fp64 model
    logp_out = torch.zeros(shape, dtype=dtype, device=input_ids.device)
    ent_out = torch.zeros(shape, dtype=dtype, device=input_ids.device)
    if lps:
        logp_out = logp_out.index_put((b_idx, t_idx + 1), torch.cat(lps))
        ent_out = ent_out.index_put((b_idx, t_idx + 1), torch.cat(ents))
    return logp_out, ent_out.detach()
