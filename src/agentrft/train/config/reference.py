"""The training config's reference page (``docs/config.md``), generated from the pydantic models themselves.

``python scripts/config_reference.py`` writes it; a test fails when the page in the repository is not what
the models generate now, so the page cannot drift from the code. One table per section (a nested model),
each key with its type, default and description as the model declares them.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

HEADER = """# Training config reference

Generated from the pydantic models in `src/agentrft/train/` by `python scripts/config_reference.py`; a test
fails when this page differs from what the code generates. A config is YAML (or a preset name) and
`--set KEY=VALUE` overrides any key below by its dotted path, e.g. `--set rollout.group_size=16`.
Presets: `agentrft train --help`; examples: `examples/`.
"""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly or as ``Model | None``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    return None


def _type_name(annotation: Any) -> str:
    text = repr(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b[a-z_]+\.", "", text.replace("<class '", "").replace("'>", ""))  # module qualifiers
    return text.replace("NoneType", "None").replace("|", "\\|")


def _default(field: FieldInfo) -> str:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        if _model_of(field.annotation):
            return "(section)"
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        return "**required**"
    return "`" + repr(value).replace("|", "\\|") + "`"


def _key(name: str, field: FieldInfo) -> str:
    return field.alias or name


def sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, type[BaseModel]]]:
    """(dotted path, model) of ``model`` and every section nested in it, depth first."""
    out = [(prefix, model)]
    for name, field in model.model_fields.items():
        sub = _model_of(field.annotation)
        if sub is not None:
            out += sections(sub, f"{prefix}{_key(name, field)}.")
    return out


def reference_markdown() -> str:
    from agentrft.train.config import TrainConfig

    parts = [HEADER]
    for path, model in sections(TrainConfig):
        title = path.rstrip(".") or "top level"
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        parts.append(f"\n## `{title}`\n" if path else "\n## top level\n")
        if doc and path:
            parts.append(f"\n{doc}\n")
        parts.append("\n| key | type | default | description |\n| --- | --- | --- | --- |\n")
        for name, field in model.model_fields.items():
            key = path + _key(name, field)
            desc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            if _model_of(field.annotation) is not None:
                desc = (desc + " " if desc else "") + f"(section `{key}` below)"
            parts.append(f"| `{key}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |\n")
    return "".join(parts)
