"""Per-request sampling seeds that do not depend on arrival order.

A concurrent rollout reaches the sampler in whatever order its episodes happen to
ask; a shared random stream would make reruns differ. Instead an unseeded request
gets a seed derived from the sampler's base seed (`reseed`), its prompt, and how
many requests with that same prompt came before it, so a rerun from the same
base seed draws the same multiset of samples. Shared by every in-process sampler.
"""

from __future__ import annotations

import hashlib
import random
from array import array

from agentrft.samplers.base import SampleRequest


class RequestSeeds:
    """Seeds for requests; `reseed` restarts the derivation from a base seed."""

    def __init__(self) -> None:
        self._base = random.SystemRandom().getrandbits(63)
        self._seen: dict[bytes, int] = {}  # prompt digest -> requests so far

    def reseed(self, seed: int) -> None:
        self._base = seed
        self._seen.clear()

    def seed_for(self, request: SampleRequest) -> int:
        """The request's own seed, else one derived from the base seed, the prompt, and the count of
        earlier requests with this prompt."""
        if request.params.seed is not None:
            return request.params.seed
        digest = hashlib.blake2b(array("q", request.prompt_ids).tobytes(), digest_size=16).digest()
        if len(self._seen) > 1_000_000:  # unbounded runs without reseed: forget, stay bounded
            self._seen.clear()
        n = self._seen.get(digest, 0)
        self._seen[digest] = n + 1
        mix = hashlib.blake2b(
            digest + self._base.to_bytes(8, "little", signed=True) + n.to_bytes(8, "little"), digest_size=8
        ).digest()
        return int.from_bytes(mix, "little") >> 1
