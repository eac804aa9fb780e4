"""Peak RSS that one SDPA forward + backward adds over a 1,339-token row (9 query, 3 kv heads, bf16) under a
boolean causal mask, per kernel: `python sdpa_backward_rss.py {any,math,flash}`."""

import resource
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
L, H, K, D = 1339, 9, 3, 64
backend = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION, "any": None}[sys.argv[1]]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
q = torch.randn(1, H, L, D, dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(1, K, L, D, dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(1, K, L, D, dtype=torch.bfloat16, requires_grad=True)
mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None]
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def f():
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


if backend is None:
    o = f()
else:
    with sdpa_kernel([backend]):
        o = f()
o.float().sum().backward()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(sys.argv[1], "peak over base MiB", round(peak - base, 1))
