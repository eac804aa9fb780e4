"""A user's environment, written against the public plugin API only (docs/environments.md walks through it):
a Gymnasium-style text env with one tool. Nothing here imports agentrft."""

from __future__ import annotations

import random
import re


class GuessEnv:
    """Guess a secret number from 1 to `size`; after each wrong guess the env says higher or lower."""

    name = "guess"
    system_prompt = "Guess the secret number. Reply with one number. You may call compare to test a number first."
    max_turns = 4
    max_tokens_per_turn = 16
    tools = ("compare",)

    def __init__(self, size: str = "8") -> None:
        self.size = int(size)  # spec options arrive as strings: guess_env:GuessEnv?size=16
        self.secret = 0

    def reset(self, seed: int) -> tuple[str, dict]:
        self.secret = random.Random(seed).randint(1, self.size)
        return f"I picked a number from 1 to {self.size}. What is it?", {"size": self.size}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        found = re.search(r"-?\d+", action)
        if found is None:
            return "Reply with a number.", 0.0, False, False, {}
        guess = int(found.group())
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {"guess": guess}
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False, False, {"guess": guess}

    def compare(self, number: int) -> str:
        """Say whether the secret number is above, below or equal to a number, without spending a guess.

        Args:
            number: the number to compare with the secret.
        """
        if number == self.secret:
            return "equal"
        return "above" if self.secret > number else "below"
