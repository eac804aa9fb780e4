import pytest

from agentrft.train.config import PRESETS, ConfigError, TrainConfig, build_config, load_config, parse_override


def test_defaults_and_presets_validate():
    assert TrainConfig().algorithm.eps_high == 0.28
    for name in PRESETS:
        cfg = load_config(name)
        assert isinstance(cfg, TrainConfig)
    from agentrft.recipes.demo import run_demo  # noqa: F401 - the demo trains with exactly these presets

    assert load_config("demo-quick").steps == 2 and load_config("demo").rollout.temperature == 0.7


def test_overrides_are_typed():
    cfg = load_config(
        "demo",
        [
            "optimizer.lr=1e-5",
            "algorithm.dynamic_sampling.enabled=true",
            "rollout.group_size=4",
            "policy.lora_target_modules=[q_proj,v_proj]",
            "algorithm.is_cap=null",
        ],
    )
    assert cfg.optimizer.lr == 1e-5 and isinstance(cfg.optimizer.lr, float)
    assert cfg.algorithm.dynamic_sampling.enabled is True
    assert cfg.rollout.group_size == 4
    assert cfg.policy.lora_target_modules == ["q_proj", "v_proj"]
    assert parse_override("a.b=x=y") == ("a.b", "x=y")


def test_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"optimizer\.lrr: Extra inputs are not permitted"):
        load_config("demo", ["optimizer.lrr=1"])
    with pytest.raises(ConfigError, match=r"rollout\.group_size"):
        load_config("demo", ["rollout.group_size=zero"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config("demo", ["optimizer.lr"])
    with pytest.raises(ConfigError, match=r"algorithm\.aggregation"):
        build_config({"algorithm": {"aggregation": "sum"}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("optimizer: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: invalid YAML \(expected ',' or '\]'"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_and_toml_files_and_save_roundtrip(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("steps: 7\nalgorithm:\n  advantage: rloo\n")
    t = tmp_path / "c.toml"
    t.write_text('steps = 7\n[algorithm]\nadvantage = "rloo"\n')
    a, b = load_config(y), load_config(t, ["steps=8"])
    assert a.algorithm.advantage == b.algorithm.advantage == "rloo"
    assert (a.steps, b.steps) == (7, 8)
    a.save(tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == a


def test_one_sampling_distribution_is_enforced():
    from agentrft.samplers.distribution import Distribution

    cfg = build_config({"rollout": {"temperature": 0.7, "top_p": 0.9}})
    assert cfg.sampling_distribution() == Distribution(temperature=0.7, top_p=0.9)
    # an old config that said the same thing twice still loads; one that mixes two distributions does not
    same = build_config({"rollout": {"temperature": 0.7}, "algorithm": {"logprob_temperature": 0.7}})
    assert same.sampling_distribution().temperature == 0.7
    with pytest.raises(ConfigError, match="logprob_temperature=1.0 differs from rollout.temperature=0.7"):
        build_config({"rollout": {"temperature": 0.7}, "algorithm": {"logprob_temperature": 1.0}})
    with pytest.raises(ConfigError, match="rollout.temperature"):
        build_config({"rollout": {"temperature": 0.0}})  # greedy rollouts cannot be trained on


def test_seed_and_tool_format_are_bounded_and_named():
    assert build_config({"seed": 2**32 - 1}).seed == 2**32 - 1  # numpy's largest seed
    for seed, why in ((2**32, "less than 4294967296"), (-1, "greater than or equal to 0")):
        with pytest.raises(ConfigError, match=f"^config: seed: Input should be {why}$"):
            build_config({"seed": seed})
    with pytest.raises(ConfigError, match=r"^config: field 'seed': integer out of range \(more than 64 bits\)$"):
        build_config({"seed": 10**30})
    with pytest.raises(ConfigError, match=r"^--set seed: cannot use value '10{30}': integer out of range"):
        build_config({}, [f"seed={10**30}"])
    with pytest.raises(
        ConfigError, match=r"^config: rollout\.tool_format: Input should be 'xml', 'hermes', 'native' or 'pythonic'$"
    ):
        build_config({"rollout": {"tool_format": "json"}})


def test_check_references_names_the_key_before_any_model(tmp_path):
    from agentrft.train.config.check import check_references

    check_references(build_config({"policy": {"name": "tiny"}}), "c.yaml")  # finqa-lite, its grader: fine
    rows = tmp_path / "d.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "q"}], "tools": [{"function": {"name": "a b"}}]}\n')
    for data, why in (
        ({"policy": {"name": "openai:gpt-4o"}}, "policy.name: 'openai:gpt-4o' cannot be trained in process; valid: smollm2-135m, tiny, hf:PATH_OR_ID"),
        ({"rollout": {"env": "gsm8k"}}, "rollout.env: unknown environment 'gsm8k'"),
        ({"rollout": {"env": f"jsonl:{rows}"}}, f"rollout.env: {rows}:1: field 'tools[0].function.name'"),
        ({"rollout": {"split": "test"}}, "rollout.split: unknown finqa-lite split 'test'"),
        ({"eval": {"every_steps": 1, "split": "dev"}}, "eval.split: unknown finqa-lite split 'dev'"),
        ({"rollout": {"grader": {"type": "numeric"}}}, "rollout.grader: reference: required field is missing"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as exc:
            check_references(build_config(data), "c.yaml")
        assert str(exc.value).startswith(f"c.yaml: {why}"), str(exc.value)


def test_the_engine_memory_bounds_are_config_options_that_reach_the_sampler(tmp_path):
    from agentrft.samplers.hf import HFSampler
    from agentrft.train.loop import build_components

    cfg = load_config(
        "demo",
        ["policy.name=tiny", "policy.sampler_kv_positions=4096", "policy.sampler_prefix_cache_tokens=0"],
    )
    comps = build_components(cfg, tmp_path)
    try:
        assert isinstance(comps.sampler, HFSampler)
        assert comps.sampler.max_kv_positions == 4096 and not comps.sampler.prefix_cache.enabled
    finally:
        comps.store.close()
        comps.sampler.close()
    unbounded = load_config("demo", ["policy.sampler_kv_positions=null"]).policy.sampler_options()
    assert unbounded["max_kv_positions"] is None
    assert "max_kv_positions" not in load_config("demo", ["policy.sampler=reference"]).policy.sampler_options()
    with pytest.raises(ConfigError, match=r"policy.sampler_kv_positions: must be >= 1, auto or null .* got 0$"):
        load_config("demo", ["policy.sampler_kv_positions=0"])
    with pytest.raises(ConfigError, match="policy.sampler_kv_positions"):
        load_config("demo", ["policy.sampler_kv_positions=lots"])
    with pytest.raises(ConfigError, match="policy.sampler_prefix_cache_tokens: must be >= 0"):
        load_config("demo", ["policy.sampler_prefix_cache_tokens=-1"])
    # by default both are sized in memory by the engine (`samplers.hf.KV_BUDGET_MIB`)
    defaults = load_config("demo").policy.sampler_options()
    assert defaults["max_kv_positions"] == defaults["prefix_cache_tokens"] == "auto"
    again = load_config("demo", ["policy.sampler_kv_positions=auto"]).policy.sampler_options()
    assert again["max_kv_positions"] == "auto"
