"""The training core every method runs on: the session (model, optimizer, checkpoints, resume), the update
step, log-probs, packing and the attention layouts of packed sequences, step metrics and progress."""
