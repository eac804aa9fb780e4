"""A sampler no trainer updates (`agentrft eval`): its weights stored as the engine computes them.

Under bf16 autocast every linear layer multiplies `weight.to(bfloat16)`, and autocast keeps that cast beside the
fp32 weight: on SmolLM2-135M the fp32 weights (540 MB) plus the casts (~270 MB). An eval-only sampler needs no fp32
master, so `store_in_compute_dtype` stores each linear layer's weight as the very bf16 tensor autocast would have
made (the same values: the model computes the same function) and drops the fp32 one.

What stays fp32 is what autocast does not cast: the token embedding (its lookup feeds the fp32 residual stream; a
head tied to it is still cast, once per autocast session) and the norms. Those tensors are copied out of the
loaded checkpoint's memory map, so the map closes: its pages, read once by the casts, would otherwise stay in the
process's resident memory (measured on SmolLM2-135M after one forward: 1,113 MiB resident with the map kept,
707 MiB with it closed, 1,142 MiB for the fp32 model under autocast).
"""

from __future__ import annotations

from typing import Any


def store_in_compute_dtype(model: Any, dtype: Any) -> int:
    """Store the weights (and biases) of `model`'s linear layers in `dtype` (all but one tied to the input embedding) and
    copy every other floating-point tensor into memory of its own; returns the number of weights cast."""
    import torch

    embedding = model.get_input_embeddings().weight
    cast = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            weight = module.weight
            if weight is not embedding and weight.dtype != dtype:
                weight.data = weight.data.to(dtype)
                if module.bias is not None:
                    module.bias.data = module.bias.data.to(dtype)
                cast += 1
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point() and tensor.dtype != dtype:
                tensor.data = tensor.data.clone()  # own storage: nothing keeps the checkpoint's map alive
    return cast
