"""Where an environment name comes from: the entry points of group ``agentrft.envs``, or ``module:Class``.

Every environment, the package's own included, is found the same way: a spec ``NAME[:ARG][?KEY=VALUE&...]``
names an entry point of group ``agentrft.envs`` (this package declares finqa-lite, finqa, jsonl, bfcl and
reasoning-gym in its ``pyproject.toml``; another package declares its own the same way), or, where NAME is no
entry point, ``MODULE:CLASS`` names a class in a module found on ``sys.path`` (``PYTHONPATH``), e.g.
``my_envs:GuessEnv?size=8``.

What the name resolves to is built by `build`:

- an object with ``from_spec(spec: EnvSpec, **kwargs)`` (a classmethod) gets the parsed spec and checks it
  (finqa-lite's levels and ``shots``, a benchmark's categories);
- any other `Environment` class (or an entry point's factory function) is called with the options as keyword
  arguments (strings; the class converts them), and takes no ARG;
- a Gymnasium-style text environment class (``reset(seed)`` and ``step(action_text)``) is wrapped by
  `envs.gym_text.GymTextEnv`, which makes one instance per episode (the options are its keyword arguments);
- the result is an `Environment`.

A name that cannot be resolved or built is one `InputError` naming the spec, before any model loads.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, TypeVar
from urllib.parse import parse_qs

from agentrft.envs.base import Environment
from agentrft.inputs import InputError

T = TypeVar("T")
ENTRY_POINT_GROUP = "agentrft.envs"
# The package's own entry points, as pyproject.toml declares them (a test keeps the two equal): used when the
# installed metadata lacks a name, e.g. a source tree run without `pip install -e .` after a new one was added.
BUILTIN: dict[str, str] = {
    "finqa-lite": "agentrft.envs.finqa.env:FinqaLiteEnv",
    "finqa": "agentrft.envs.finqa.json_env:FinqaJsonEnv",
    "jsonl": "agentrft.envs.jsonl:JsonlEnv",
    "bfcl": "agentrft.envs.bfcl.env:BfclEnv",
    "reasoning-gym": "agentrft.envs.reasoning_gym.env:ReasoningGymEnv",
}
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class EnvSpec:
    """A parsed environment spec: ``name:arg?options``."""

    text: str
    name: str
    arg: str = ""
    options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> EnvSpec:
        base, _, query = text.strip().partition("?")
        name, _, arg = base.partition(":")
        params = parse_qs(query, keep_blank_values=True) if query else {}
        return cls(text=text.strip(), name=name, arg=arg, options={k: v[-1] for k, v in params.items()})

    def error(self, why: str = "") -> InputError:
        from agentrft.envs.registry import unknown_env

        return unknown_env(self.text, why)

    def known(self, *keys: str) -> dict[str, str]:
        """The options, refusing any key not in `keys`."""
        unknown = sorted(set(self.options) - set(keys))
        if unknown:
            raise self.error(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(keys) or 'none'})")
        return dict(self.options)

    def int_option(self, key: str, default: int, *, minimum: int = 0) -> int:
        text = self.options.get(key)
        if text is None:
            return default
        if not re.fullmatch(r"[0-9]+", text) or int(text) < minimum:
            raise self.error(f"option {key} must be an integer >= {minimum}, got {text!r}")
        return int(text)


def installed() -> dict[str, str]:
    """Environment names → ``module:attr``, the installed entry points over the package's own."""
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value
    return found


def _load(target: str, spec: EnvSpec) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise spec.error(f"cannot import {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module: what it raises on import is one line, not a traceback
        raise spec.error(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise spec.error(f"module {module_name!r} has no attribute {attr!r}")
    return obj


def started(spec: EnvSpec, make: Callable[[], T]) -> T:
    """``make()``, with what the user's code raises turned into one InputError naming the spec."""
    try:
        return make()
    except TypeError as exc:
        raise spec.error(f"{spec.name} does not accept these options: {exc}") from None
    except InputError:
        raise
    except Exception as exc:
        raise spec.error(f"{spec.name} failed to start: {type(exc).__name__}: {exc}") from None


def resolve(spec: EnvSpec) -> tuple[Any, EnvSpec]:
    """What a spec names, and the spec its builder sees (for ``module:Class`` the class is no ARG).

    ``module:Class`` must name a class: an `Environment` subclass or a text env. Anything else (a function such
    as ``os:system``) is refused before it is called: a spec can come from a stored config, and only an
    installed entry point may name a factory function."""
    from agentrft.envs.gym_text import is_text_env

    names = installed()
    if spec.name in names:
        return _load(names[spec.name], spec), spec
    if spec.arg and _CLASS_PATH.fullmatch(spec.arg) and _CLASS_PATH.fullmatch(spec.name):
        target = _load(f"{spec.name}:{spec.arg}", spec)
        if not (inspect.isclass(target) and (issubclass(target, Environment) or is_text_env(target))):
            raise spec.error(
                f"{spec.name}:{spec.arg} is not an environment class (an Environment subclass, or a class with "
                "reset(seed) and step(action))"
            )
        return target, EnvSpec(text=spec.text, name=f"{spec.name}:{spec.arg}", options=spec.options)
    raise spec.error()


def build(target: Any, spec: EnvSpec, **kwargs: Any) -> Environment:
    """An Environment from what a name resolved to (see the module's docstring)."""
    from agentrft.envs.gym_text import GymTextEnv, is_text_env

    from_spec = getattr(target, "from_spec", None)
    if from_spec is not None:
        made = from_spec(spec, **kwargs)
    elif inspect.isclass(target) and is_text_env(target):
        return GymTextEnv.from_spec_of(target, spec, **kwargs)
    elif callable(target):
        if spec.arg:
            raise spec.error(f"{spec.name} takes no argument after ':' (options go after '?')")
        made = started(spec, lambda: target(**spec.options, **kwargs))
    else:
        raise spec.error(f"{spec.name} is neither an environment class nor a factory")
    if isinstance(made, Environment):
        return made
    raise spec.error(f"{spec.name} made a {type(made).__name__}, not an Environment")
