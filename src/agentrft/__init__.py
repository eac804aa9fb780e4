"""agentrft: agentic reinforcement fine-tuning.

Layers (each depends only on those above): types → store → tools/envs/tasks →
graders → samplers → rollout → algos → train → eval → cli. See ARCHITECTURE.md.
"""

__version__ = "0.1.0"
