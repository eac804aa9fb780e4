"""The per-step progress line says what the step measured and nothing it did not."""

from agentrft.train.core.progress import step_line


def test_step_line_for_grpo_and_for_sft():
    grpo = {"train_reward_mean": 0.4123, "train_success_rate": 0.34, "excluded_trajectories": 0.0}
    grpo |= {"time/sampling_s": 9.13, "time/training_s": 7.94}
    assert step_line(3, 10, grpo) == "step 3/10  reward 0.412  success 0.340  excluded 0  sample 9.1s  update 7.9s"
    sft = {"nll": 0.19051, "loss": 0.19051, "time/training_s": 22.76}
    assert step_line(3, 30, sft) == "step 3/30  nll 0.191  update 22.8s"  # no reward or sampling it never had
