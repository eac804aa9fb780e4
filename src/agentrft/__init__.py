"""agentrft: agentic reinforcement fine-tuning.

Layers (each imports only from its own and those before it; tests/test_layers.py checks): types (and leaf
helpers) → store → tools, envs → graders → samplers → rollout → algos → eval → train → rft → recipes → cli.
See ARCHITECTURE.md.
"""

__version__ = "0.1.0"
