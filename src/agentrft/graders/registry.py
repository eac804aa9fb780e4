"""One registry of grader types and `load_grader(spec)`.

Each grader class registers under its spec `type` with a pydantic `Spec` model
(extra="forbid") and a `build(spec, where, options)` classmethod. Validation
errors are turned into one `GraderSpecError` naming the JSON path of the fault,
e.g. `graders.acc.operation: must be one of eq, ne, like, ilike`, before
anything runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from agentrft.graders.base import Grader, GraderSpecError
from agentrft.inputs import InputError, loads_json, read_structured

G = TypeVar("G", bound=type[Grader])
_REGISTRY: dict[str, type[Grader]] = {}


class SpecBase(BaseModel):
    """Fields every spec accepts. `pass_threshold` is an agentrft extension on all types."""

    model_config = ConfigDict(extra="forbid")

    type: str
    name: str | None = None
    pass_threshold: float | None = None


@dataclass
class LoadOptions:
    """Run-time settings that do not belong in a spec (where the judge lives, caches, transports).

    `transport` is an httpx transport used by model/endpoint graders (tests pass
    `httpx.MockTransport`). `cache_dir=None` keeps judge replies in
    `~/.cache/agentrft/graders`; `cache=False` turns the cache off.
    """

    base_url: str | None = None
    api_key: str | None = None
    cache_dir: str | Path | None = None
    cache: bool = True
    transport: Any = None
    concurrency: int = 8
    base_dir: str | Path | None = None  # relative file paths in specs (python source_path); set by load_grader


def register_grader(type_name: str) -> Callable[[G], G]:
    def deco(cls: G) -> G:
        if type_name in _REGISTRY:
            raise ValueError(f"grader type {type_name!r} registered twice")
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls

    return deco


ENTRY_POINT_GROUP = "agentrft.graders"
# Grader types that live beside what they grade, in a layer above the graders (an environment's own grader
# type; the reward model's, beside its training), as pyproject.toml declares them under the entry-point group
# (a test keeps the two equal). Their modules are imported when a spec names the type, so loading any other
# grader imports no environment, no benchmark package and no torch.
PLUGIN_BUILTIN: dict[str, str] = {
    "bfcl": "agentrft.envs.bfcl.grader",
    "finqa_process": "agentrft.envs.finqa.process_grader",
    "reasoning_gym": "agentrft.envs.reasoning_gym.grader",
    "reward_model": "agentrft.train.data.rm_grader",
}


def _plugin_types() -> dict[str, str]:
    """Grader type → module that registers it: the package's own, then installed entry points."""
    from importlib.metadata import entry_points

    found = dict(PLUGIN_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value.partition(":")[0]
    return found


def grader_types() -> list[str]:
    _ensure_builtin()
    return sorted(set(_REGISTRY) | set(_plugin_types()))


def _ensure_builtin() -> None:
    # Importing the modules registers their classes (kept lazy to avoid import cycles).
    from agentrft.graders import (  # noqa: F401
        env_reward,
        model,
        multi,
        numeric,
        python_grader,
        text,
        trajectory,
    )


def _load_plugin(kind: str, where: str) -> type[Grader] | None:
    module = _plugin_types().get(kind)
    if module is None:
        return None
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:
        raise GraderSpecError(
            _fmt_loc(where, ("type",)), f"grader type {kind!r} could not load ({module}): {type(exc).__name__}: {exc}"
        ) from None
    return _REGISTRY.get(kind)


def _fmt_loc(prefix: str, loc: tuple[Any, ...]) -> str:
    parts = [prefix] if prefix else []
    for p in loc:
        if isinstance(p, int):
            if parts:
                parts[-1] += f"[{p}]"
            else:
                parts.append(f"[{p}]")
        else:
            parts.append(str(p))
    return ".".join(parts)


def _fmt_error(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        return f"must be one of {expected}"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    return str(err.get("msg", "invalid"))


def validate_spec(model: type[BaseModel], spec: dict[str, Any], where: str) -> Any:
    try:
        return model.model_validate(spec)
    except ValidationError as e:
        err = e.errors()[0]
        raise GraderSpecError(_fmt_loc(where, tuple(err["loc"])), _fmt_error(dict(err))) from None


def build_grader(spec: Any, where: str, options: LoadOptions, *, allow_multi: bool = True) -> Grader:
    """Validate one spec dict and build its grader (used recursively by `multi`)."""
    _ensure_builtin()
    if not isinstance(spec, dict):
        raise GraderSpecError(where, f"a grader spec must be a JSON object, got {type(spec).__name__}")
    kind = spec.get("type")
    if kind is None:
        raise GraderSpecError(_fmt_loc(where, ("type",)), "required field is missing")
    cls = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None and isinstance(kind, str):
        cls = _load_plugin(kind, where)
    if cls is None:
        raise GraderSpecError(
            _fmt_loc(where, ("type",)), f"unknown grader type {kind!r}; valid types: {', '.join(grader_types())}"
        )
    if kind == "multi" and not allow_multi:
        raise GraderSpecError(_fmt_loc(where, ("type",)), "multi graders cannot be nested")
    parsed = validate_spec(cls.Spec, spec, where)  # type: ignore[attr-defined]
    return cls.build(parsed, where, options)  # type: ignore[attr-defined]


def load_grader(spec: dict[str, Any] | str | Path, options: LoadOptions | None = None) -> Grader:
    """A grader from a spec dict, a JSON/YAML file path, or JSON text.

    Raises `GraderSpecError` (path of the fault; file name prefixed when read
    from a file) before anything runs.
    """
    options = options or LoadOptions()
    origin = ""
    if isinstance(spec, Path) or (isinstance(spec, str) and not spec.lstrip().startswith("{")):
        path = Path(spec)
        origin = str(path)
        try:
            spec = read_structured(path, default=".json")
        except InputError as e:
            raise GraderSpecError("", str(e)) from None
        if options.base_dir is None:
            options = dataclasses.replace(options, base_dir=path.parent)
    elif isinstance(spec, str):
        try:
            spec = loads_json(spec)
        except InputError as e:
            raise GraderSpecError("", f"grader spec: {e}") from None
    try:
        return build_grader(spec, "", options)
    except GraderSpecError as e:
        if origin:
            raise GraderSpecError(f"{origin}: {e.path}" if e.path else origin, e.message, e.flag) from None
        raise
