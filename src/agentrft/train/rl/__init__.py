"""Online RL (GRPO/DAPO and its variants): the stages of a step, the task sources (shuffle, curriculum,
branches of recorded episodes), the asynchronous pipeline and its Ray workers, reward-hacking tripwires."""
