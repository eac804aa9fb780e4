"""The body of a reinforcement fine-tuning job, as the hosted services take it, plus local settings.

Read from a JSON/YAML file (`load_job_spec`, ``agentrft rft create --job job.json``) or built from
command-line flags (`job_spec_from_flags`); either way one pydantic model checks it and an error
names the file and the field (``job.json: field 'method.reinforcement.hyperparameters.batch_size':
must be 'auto' or an integer >= 1``). What is accepted:

* ``model``: a policy agentrft trains in process: ``tiny``, ``smollm2-135m`` or ``hf:PATH_OR_ID``
  (a hosted model name such as ``o4-mini-2025-04-16`` is refused with that list);
* ``training_file``, ``validation_file``: local JSONL paths (relative to the job file), not uploaded
  file ids; both required, as Azure's RFT requires them;
* ``method``: ``{"type": "reinforcement", "reinforcement": {"grader": {...}, "hyperparameters": {...}}}``;
  the grader is any spec `agentrft.graders` loads; hyperparameters in `Hyperparameters`;
* ``seed`` (default 0, so that a job is reproducible), ``suffix`` (at most 64 characters of letters,
  digits, ``-`` and ``_``), ``metadata`` (at most 16 string pairs, keys <= 64 and values <= 512
  characters: the hosted limits);
* ``agentrft``: what only a local run needs (`LocalSettings`): tool implementations (a Python module,
  or an HTTP endpoint per tool), sampling temperature and token limits.

Paths in the spec are made absolute against the job file's directory (the command line's working
directory for flags), also a python grader's ``source_path``, so that the saved spec runs the same
from anywhere. No torch here: a spec is checked before anything loads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrft.inputs import InputError, check_value, loads_yaml, read_structured
from agentrft.rollout.formats import FormatName
from agentrft.tools.http_tool import HttpEndpoint

_SUFFIX = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_HOSTED_FILE_ID = re.compile(r"^file-[A-Za-z0-9]+$")


class JobSpecError(InputError):
    """A job body that cannot run; the message names the file (or ``flags``) and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _auto_number(value: Any, *, integer: bool, low: float, high: float, low_open: bool = False) -> Any:
    """``"auto"``, or a number in range; the message says which (pydantic's union errors do not)."""
    if value == "auto":
        return value
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    bound = f"> {low:g}" if low_open else f">= {low:g}"
    if isinstance(value, bool) or not ok_type or (value <= low if low_open else value < low) or value > high:
        raise ValueError(f"must be 'auto' or {kind} {bound} and <= {high:g}, not {value!r}")
    return value


class Hyperparameters(_Model):
    """The hosted service's reinforcement hyperparameters; how each maps to the GRPO config is in
    `mapping.py` and docs/rft.md. ``"auto"`` resolves to a documented default."""

    n_epochs: int | Literal["auto"] = Field(default="auto", description="passes over the training file")
    batch_size: int | Literal["auto"] = Field(default="auto", description="training rows (prompts) per step")
    learning_rate_multiplier: float | Literal["auto"] = Field(default="auto", description="times the base lr")
    eval_interval: int | Literal["auto"] = Field(default="auto", description="steps between validation evals")
    eval_samples: int | Literal["auto"] = Field(default="auto", description="samples per validation row")
    compute_multiplier: float | Literal["auto"] = Field(default="auto", description="scales samples per prompt")
    reasoning_effort: Literal["default", "low", "medium", "high"] = Field(
        default="default", description="accepted; not applicable to models without a reasoning mode"
    )

    @field_validator("n_epochs", "batch_size", "eval_interval", "eval_samples", mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return _auto_number(v, integer=True, low=1, high=100_000)

    @field_validator("learning_rate_multiplier", "compute_multiplier", mode="before")
    @classmethod
    def _multiplier(cls, v: Any) -> Any:
        return _auto_number(v, integer=False, low=0, high=100, low_open=True)


class Reinforcement(_Model):
    grader: dict[str, Any] = Field(description="the grader spec (any type agentrft.graders loads)")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)


class Method(_Model):
    type: Literal["reinforcement"]
    reinforcement: Reinforcement


class LocalSettings(_Model):
    """Settings a hosted job has no field for (the ``agentrft`` key of the job body)."""

    tools_module: str | None = Field(
        default=None, description="a .py file (relative to the job file) or module whose functions implement tools"
    )
    tool_endpoints: dict[str, HttpEndpoint] = Field(
        default_factory=dict, description="tool name -> URL or {url, timeout_s, headers} (tools/http_tool.py)"
    )
    temperature: float = Field(
        default=0.7,
        gt=0.0,
        le=2.0,
        description="sampling temperature of training and validation (0.7: the demo's, see train/config/presets.py)",
    )
    max_tokens: int = Field(default=128, ge=1, le=32768, description="sampled tokens per assistant turn")
    tool_format: FormatName = Field(default="xml", description="how tool calls look in the model's text")
    gradient_checkpointing: bool = Field(default=False, description="less activation memory, ~1/3 more compute")
    grader_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible endpoint of the score_model/label_model judges that name none "
        "(written into their specs as base_url)",
    )

    @field_validator("tool_endpoints", mode="before")
    @classmethod
    def _urls(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {k: {"url": e} if isinstance(e, str) else e for k, e in v.items()}
        return v


class JobSpec(_Model):
    """A reinforcement fine-tuning job body (see the module docstring)."""

    model: str
    training_file: str
    validation_file: str
    method: Method
    seed: int = Field(default=0, ge=0, lt=2**32)
    suffix: str | None = None
    metadata: dict[str, str] | None = None
    agentrft: LocalSettings = Field(default_factory=LocalSettings)

    @field_validator("model")
    @classmethod
    def _local_model(cls, v: str) -> str:
        from agentrft.samplers.policies import is_in_process

        if not is_in_process(v):
            raise ValueError(
                f"{v!r} is not a model agentrft trains here; use tiny, smollm2-135m or hf:PATH_OR_ID "
                "(a local Hugging Face checkpoint)"
            )
        return v

    @field_validator("training_file", "validation_file")
    @classmethod
    def _local_file(cls, v: str) -> str:
        if _HOSTED_FILE_ID.match(v) and not Path(v).exists():
            raise ValueError(f"{v!r} looks like an uploaded-file id; give the path of the local JSONL file")
        if not v.strip():
            raise ValueError("must be a file path")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v is not None and not _SUFFIX.match(v):
            raise ValueError("must be 1-64 letters, digits, '-' or '_'")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        if v is None:
            return v
        if len(v) > 16:
            raise ValueError(f"at most 16 pairs, not {len(v)}")
        for key, value in v.items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError(f"key {key[:70]!r}: keys have at most 64 characters, values at most 512")
        return v

    @property
    def grader(self) -> dict[str, Any]:
        return self.method.reinforcement.grader

    @property
    def hyperparameters(self) -> Hyperparameters:
        return self.method.reinforcement.hyperparameters


def _field(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _hint(body: dict[str, Any]) -> str | None:
    """A clearer word for the hosted fields that mean something else here."""
    if "hyperparameters" in body:
        return "field 'hyperparameters': give them as method.reinforcement.hyperparameters"
    if isinstance(body.get("method"), dict) and body["method"].get("type") not in (None, "reinforcement"):
        return (
            f"field 'method.type': {body['method']['type']!r} jobs do not run here; this command runs "
            "'reinforcement' jobs (supervised: agentrft sft; dpo: agentrft dpo)"
        )
    if "integrations" in body:
        return "field 'integrations': not supported locally (metrics go to the job's metrics.jsonl and events)"
    return None


def parse_job_spec(body: Any, where: str, base_dir: Path) -> JobSpec:
    """Check a job body; paths are made absolute against ``base_dir``. JobSpecError names ``where`` and the field."""
    if not isinstance(body, dict):
        raise JobSpecError(f"{where}: a job body must be an object (model, training_file, method, ...)")
    hint = _hint(body)
    if hint:
        raise JobSpecError(f"{where}: {hint}")
    try:
        check_value(body, where)
        spec = JobSpec.model_validate(body)
    except InputError as exc:
        raise JobSpecError(str(exc)) from None
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (a job has model, training_file, validation_file, method, seed, suffix, metadata, agentrft)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise JobSpecError(f"{where}: field '{_field(tuple(err['loc']))}': {msg}{more}") from None
    return _absolute(spec, base_dir)


def _abs(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


JUDGE_TYPES = ("score_model", "label_model")


def _absolute_grader(spec: Any, base: Path, judge_url: str | None = None) -> Any:
    """Relative file paths inside a grader spec (python ``source_path``, reward_model ``path``) made absolute;
    judges without a ``base_url`` get ``judge_url`` when one is given."""
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    if judge_url is not None and out.get("type") in JUDGE_TYPES and not out.get("base_url"):
        out["base_url"] = judge_url
    if out.get("type") == "python" and isinstance(out.get("source_path"), str):
        out["source_path"] = _abs(out["source_path"], base)
    if out.get("type") == "reward_model" and isinstance(out.get("path"), str):
        out["path"] = _abs(out["path"], base)
    if out.get("type") == "multi" and isinstance(out.get("graders"), dict):
        out["graders"] = {k: _absolute_grader(v, base, judge_url) for k, v in out["graders"].items()}
    return out


def _absolute(spec: JobSpec, base: Path) -> JobSpec:
    model = spec.model
    if model.startswith("hf:") and (base / model[3:]).exists() and not Path(model[3:]).is_absolute():
        model = "hf:" + str((base / model[3:]).resolve())
    local = spec.agentrft
    module = local.tools_module
    if module is not None and module.endswith(".py"):
        module = _abs(module, base)
    grader = _absolute_grader(spec.grader, base, local.grader_base_url)
    reinforcement = spec.method.reinforcement.model_copy(update={"grader": grader})
    return spec.model_copy(
        update={
            "model": model,
            "training_file": _abs(spec.training_file, base),
            "validation_file": _abs(spec.validation_file, base),
            "method": spec.method.model_copy(update={"reinforcement": reinforcement}),
            "agentrft": local.model_copy(update={"tools_module": module}),
        }
    )


def load_job_spec(path: str | Path) -> JobSpec:
    """A job body from a JSON or YAML file (by suffix; JSON otherwise)."""
    path = Path(path)
    try:
        body = read_structured(path, default=".json")
    except InputError as exc:
        raise JobSpecError(str(exc)) from None
    return parse_job_spec(body, str(path), path.resolve().parent)


def _flag_value(item: str) -> tuple[str, Any]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise JobSpecError(f"--hyperparameters {item!r}: expected KEY=VALUE, e.g. n_epochs=2")
    value = loads_yaml(raw) if raw.strip() else ""
    return key.strip(), value


def job_spec_from_flags(
    *,
    model: str | None,
    training_file: str | None,
    validation_file: str | None,
    grader: str | None,
    hyperparameters: list[str],
    seed: int | None,
    suffix: str | None,
    tools_module: str | None = None,
) -> JobSpec:
    """A job body from `agentrft rft create`'s flags; the grader is read from its file (JSON or YAML), and its
    relative paths resolve against that file's directory."""
    missing = [
        flag
        for flag, value in (
            ("--model", model),
            ("--training-file", training_file),
            ("--validation-file", validation_file),
            ("--grader", grader),
        )
        if value is None
    ]
    if missing:
        raise JobSpecError(f"flags: {', '.join(missing)} missing (or give the whole body with --job FILE)")
    assert grader is not None
    try:
        grader_spec = read_structured(Path(grader), default=".json")
    except InputError as exc:
        raise JobSpecError(f"--grader {exc}") from None
    body: dict[str, Any] = {
        "model": model,
        "training_file": training_file,
        "validation_file": validation_file,
        "method": {
            "type": "reinforcement",
            "reinforcement": {
                "grader": _absolute_grader(grader_spec, Path(grader).resolve().parent),
                "hyperparameters": dict(_flag_value(h) for h in hyperparameters),
            },
        },
    }
    if seed is not None:
        body["seed"] = seed
    if suffix is not None:
        body["suffix"] = suffix
    if tools_module is not None:
        body["agentrft"] = {"tools_module": tools_module}
    return parse_job_spec(body, "flags", Path.cwd())
