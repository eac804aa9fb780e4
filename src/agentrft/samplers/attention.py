"""The attention implementation ``agentrft_sdpa``: transformers' SDPA, with two additions that leave its results alone.

* **Grouped-query heads folded into the query rows** when a call brings a mask shared by every head (the engine's
  decode steps: a few queries per cache row, a ``[B, 1, Q, L]`` boolean mask): the R query heads that share a key /
  value head become R x Q query rows of that one head, so SDPA walks each head's keys once for all of them instead
  of once per query head. The same attention per query row (tested against SDPA with repeated heads); on the 2-core
  CPU the flash kernel's per-row overhead dominates such calls, and folding cut one level-3 decode step's attention
  1.8x at two slots per row and 4x at one (`benchmarks/long_episodes.py`). Transformers' own ``pack_gqa`` does this
  for a single query only, and not when grouped-query SDPA is forced (`hf.enable_sdpa_gqa`).
* **A layout** a caller hands a forward as the keyword ``agentrft_layout`` (anything with ``attend``): the trainer's
  shared-prefix segment layout (`train/core/segment_attention.py`) computes the attention itself.
* **A shared head** a caller hands a forward as the keyword ``agentrft_head`` (anything with ``layers``: per layer
  the keys and values ``(1, K, P, D)`` of P positions every batch row sees before its own): the engine's decode
  steps (`samplers/shared_head.py`), where the rows of a batch share a long prompt prefix that is stored once.
  Each query's softmax runs over the head's P keys and its row's visible keys together, so the result is that of
  the row holding the head's keys itself; the head's keys are multiplied once for the queries of every row. Under
  features that path does not compute (a sliding window, soft-capping, sinks) the head is written in front of each
  row's keys for the call and SDPA attends over them.

Everything else goes to transformers' SDPA unchanged. `use_agentrft_attention` registers the implementation and
switches a model from ``sdpa`` to it; the sampler does so for its model, the trainer for the policy it updates (the
same model when they share it).

Shape legend: B batch rows, H query heads, K kv heads, R = H / K, Q queries per row, L keys, D head dim.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

NAME = "agentrft_sdpa"
LAYOUT_KWARG = "agentrft_layout"
HEAD_KWARG = "agentrft_head"
FOLD_MAX_QUERIES = 16  # decode steps; a prefill's queries attend causally through SDPA's own kernels
# attention features neither the fold nor a layout computes: such a call goes to SDPA (the fold) or is refused
_NOT_PLAIN = ("sliding_window", "softcap", "s_aux")


class Layout(Protocol):
    def attend(self, module: Any, query: Tensor, key: Tensor, value: Tensor, scaling: float | None) -> Tensor:
        """Attention output (B, Q, H, D) for q (B, H, Q, D), k and v (B, K, L, D)."""
        ...


def folded_gqa_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scaling: float | None) -> Tensor:
    """SDPA of q (B, H, Q, D) over k, v (B, K, L, D) under ``mask`` (B, 1, Q, L), with the R query heads of each
    kv head as R x Q rows of one head; returns (B, Q, H, D). Query head h uses kv head h // R, as in
    ``repeat_kv``, so head h = g R + j becomes row j Q + q of head g."""
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    r = heads // kv_heads
    q = query.reshape(b, kv_heads, r * q_len, dim)
    m = mask[:, :, None].expand(mask.shape[0], 1, r, q_len, mask.shape[-1]).reshape(mask.shape[0], 1, r * q_len, -1)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=m, scale=scaling)
    return out.reshape(b, heads, q_len, dim).transpose(1, 2).contiguous()


def shared_head_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor, head_key: Tensor, head_value: Tensor, scaling: float | None
) -> Tensor:
    """Attention of q (B, H, Q, D) over a head every row sees, k and v (1, K, P, D), followed by each row's own k, v
    (B, K, L, D) under the boolean ``mask`` (B, 1, Q, L); returns (B, Q, H, D). Query heads are folded as in
    `folded_gqa_attention`; the scores are softmaxed (in fp32 at least) over the P + L keys together."""
    b, heads, q_len, dim = query.shape
    kv_heads, p_len, l_len = key.shape[1], head_key.shape[2], key.shape[2]
    n = heads // kv_heads * q_len
    scale = scaling if scaling is not None else dim**-0.5
    q = query.reshape(b, kv_heads, n, dim)
    q_all = q.transpose(0, 1).reshape(kv_heads, b * n, dim)  # every row's queries against one copy of the head
    s_head = torch.matmul(q_all, head_key[0].transpose(1, 2)).reshape(kv_heads, b, n, p_len).transpose(0, 1)
    m = mask[:, :, None].expand(b, 1, heads // kv_heads, q_len, l_len).reshape(b, 1, n, l_len)
    s_rows = torch.matmul(q, key.transpose(2, 3)).masked_fill(~m, float("-inf"))
    scores = torch.cat([s_head, s_rows], dim=-1)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))  # bf16 scores softmaxed in fp32
    probs = torch.softmax(scores * scale, dim=-1).to(value.dtype)
    p_head, p_rows = probs.split([p_len, l_len], dim=-1)
    from_head = torch.matmul(p_head.transpose(0, 1).reshape(kv_heads, b * n, p_len), head_value[0])
    out = torch.matmul(p_rows, value) + from_head.reshape(kv_heads, b, n, dim).transpose(0, 1)
    return out.reshape(b, heads, q_len, dim).transpose(1, 2).contiguous()


def _foldable(
    module: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout: float, kwargs: dict
) -> bool:
    groups = getattr(module, "num_key_value_groups", 1)
    return (
        groups > 1
        and query.shape[1] == key.shape[1] * groups
        and query.shape[0] == key.shape[0]
        and query.shape[-1] == value.shape[-1]
        and query.shape[2] <= FOLD_MAX_QUERIES
        and mask is not None
        and mask.dim() == 4
        and mask.shape[1] == 1
        and not dropout
        and all(kwargs.get(k) is None for k in (*_NOT_PLAIN, "position_bias"))
    )


def _attention(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout: Layout | None = kwargs.pop(LAYOUT_KWARG, None)
    head = kwargs.pop(HEAD_KWARG, None)
    if head is not None:
        mask = attention_mask
        if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
            raise ValueError("a shared head needs the engine's [B, 1, Q, L] boolean mask")
        head_key, head_value = head.layers[module.layer_idx]
        if dropout or any(kwargs.get(k) is not None for k in (*_NOT_PLAIN, "position_bias")):
            # features this path does not compute (a sliding window, soft-capping, sinks): the head is written in
            # front of every row's keys for this layer, and SDPA sees what a row holding the prefix would show it
            b = key.shape[0]
            key = torch.cat([head_key.expand(b, -1, -1, -1), key], dim=2)
            value = torch.cat([head_value.expand(b, -1, -1, -1), value], dim=2)
            attention_mask = torch.cat([mask.new_ones(*mask.shape[:3], head_key.shape[2]), mask], dim=-1)
        else:
            return shared_head_attention(query, key, value, mask, head_key, head_value, scaling), None
    if layout is not None:
        unsupported = [k for k in _NOT_PLAIN if kwargs.get(k) is not None]
        if dropout or unsupported:
            raise ValueError(
                f"the {type(layout).__name__} computes plain causal attention; "
                f"this model also needs {unsupported or ['dropout']}"
            )
        return layout.attend(module, query, key, value, scaling), None
    if attention_mask is not None and _foldable(module, query, key, value, attention_mask, dropout, kwargs):
        return folded_gqa_attention(query, key, value, attention_mask, scaling), None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def use_agentrft_attention(model: Any, required: bool = True) -> bool:
    """Register ``agentrft_sdpa`` with transformers (once) and switch ``model`` to it from plain SDPA (a model
    already on it is left as it is); returns whether the model is on it. A model on another implementation, or of
    a class that cannot take a registered one (Falcon, remote code), is refused, or with ``required=False`` left
    as it is (the sampler: the fold is a speed-up; the trainer's segment layout needs it)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, _attention)
        AttentionMaskInterface.register(NAME, sdpa_mask)
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == NAME:
        return True
    can_switch = getattr(type(model), "_can_set_attn_implementation", None)
    if impl != "sdpa" or (can_switch is not None and not can_switch()):
        if not required:
            return False
        why = f"a model on sdpa attention, not {impl!r}" if impl != "sdpa" else "a model class that can switch"
        raise ValueError(f"the {NAME} attention implementation needs {why} ({type(model).__name__})")
    model.set_attn_implementation(NAME)
    if getattr(config, "_attn_implementation", None) != NAME:  # transformers only warns when a model cannot switch
        raise ValueError(f"{type(model).__name__} cannot take the {NAME} attention implementation")
    return True


def uses_agentrft_attention(model: Any) -> bool:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME
