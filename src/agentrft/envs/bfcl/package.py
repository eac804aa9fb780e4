"""The one place that touches the package bfcl-eval: its data, its tool conversion, its API classes, its checkers.

bfcl-eval declares dependencies for every model vendor it can query (anthropic, google-genai, cohere, mistralai,
qwen-agent, sentence-transformers, faiss, ...) and pins ``numpy==1.26.4``, which would downgrade the numpy the
rest of the stack runs on. agentrft uses only its data files, its stateful API classes (pure Python, plus mpmath)
and its checkers, so it is installed without its declared dependencies (``pip install --no-deps bfcl-eval``,
done by ``scripts/setup.sh``) and the ``bfcl`` extra names what those parts import (pandas, overrides, tenacity,
tree-sitter, python-dotenv, openai, mpmath).

One module of the package cannot be imported that way: ``bfcl_eval.constants.model_config`` imports every vendor
handler, and the AST checker imports it only to ask whether a model's function names had their dots replaced by
underscores. Where the real module fails to import, a stand-in module holding that one entry, for the OpenAI
function-calling model whose conventions agentrft follows (`CHECKER_MODEL`: dots become underscores), is put in
its place; nothing else of the package is replaced.

Grading calls the package's own per-entry evaluators (``eval_runner._evaluate_single_ast_entry``,
``_evaluate_single_relevance_entry``, ``_evaluate_single_multi_turn_entry``) with the package's own OpenAI
function-calling handler's decoders, on model results in the shape that handler records, so a verdict here is
the official one on the same outputs.
"""

from __future__ import annotations

import copy
import importlib
import re
import sys
import types
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

from agentrft.inputs import InputError

CHECKER_MODEL = "gpt-4o-2024-11-20-FC"  # an OpenAI function-calling model: dotted names are sent with underscores
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
SINGLE_TURN = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
ALIASES = {
    "simple": "simple_python",
    "base": "multi_turn_base",
    "miss_func": "multi_turn_miss_func",
    "miss_param": "multi_turn_miss_param",
    "long_context": "multi_turn_long_context",
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def category_name(name: str) -> str:
    """The package's category name for a spec's (``simple`` is ``simple_python``, ``miss_func`` is
    ``multi_turn_miss_func``); InputError for one this environment does not serve."""
    full = ALIASES.get(name, name)
    if full not in MULTI_TURN + SINGLE_TURN:
        valid = ", ".join([*ALIASES, *MULTI_TURN, *SINGLE_TURN])
        raise InputError(f"unknown BFCL category {name!r}; valid: {valid}")
    return full


def _install_model_config_stand_in() -> None:
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
        return
    except Exception:
        sys.modules.pop(name, None)

    @dataclass
    class _Config:
        underscore_to_dot: bool = True
        is_fc_model: bool = True

    stand_in = types.ModuleType(name)
    stand_in.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: _Config()}  # type: ignore[attr-defined]
    stand_in.__doc__ = "agentrft's stand-in: the one entry the AST checker reads (see agentrft.envs.bfcl.package)"
    sys.modules[name] = stand_in


@dataclass(frozen=True)
class Bfcl:
    """The package's modules agentrft calls."""

    utils: Any
    runner: Any
    multi_turn: Any
    handler_utils: Any
    enums: Any
    type_mappings: Any
    prompts: Any
    handler: Any


@cache
def bfcl() -> Bfcl:
    """Import the parts of bfcl-eval agentrft uses (once); InputError naming the install line when it is missing."""
    try:
        importlib.import_module("bfcl_eval")
    except ImportError:
        raise InputError(
            "bfcl environments need the package bfcl-eval: pip install 'agentrft[bfcl]' && "
            "pip install --no-deps bfcl-eval (scripts/setup.sh does both)"
        ) from None
    _install_model_config_stand_in()
    try:
        runner = importlib.import_module("bfcl_eval.eval_checker.eval_runner")
        completion = importlib.import_module("bfcl_eval.model_handler.api_inference.openai_completion")
        mods = {
            n: importlib.import_module(f"bfcl_eval.{m}")
            for n, m in (
                ("utils", "utils"),
                ("multi_turn", "eval_checker.multi_turn_eval.multi_turn_utils"),
                ("handler_utils", "model_handler.utils"),
                ("enums", "constants.enums"),
                ("type_mappings", "constants.type_mappings"),
                ("prompts", "constants.default_prompts"),
            )
        }
    except ImportError as exc:
        raise InputError(
            f"bfcl-eval is installed but a module it needs is not ({exc}); pip install 'agentrft[bfcl]'"
        ) from None
    # The package's own OpenAI function-calling handler, for its decoders alone (no client is made).
    handler = completion.OpenAICompletionsHandler.__new__(completion.OpenAICompletionsHandler)
    handler.is_fc_model = True
    handler.model_name = CHECKER_MODEL
    return Bfcl(runner=runner, handler=handler, **mods)


def load_category(category: str) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(test entry, ground truth) pairs of one category, as the package loads them (function docs populated,
    held-out functions of miss_func moved to ``missed_function``, the language hint added); no ground truth for
    the relevance categories."""
    b = bfcl()
    entries = b.utils.load_dataset_entry(category)
    if category in ("irrelevance", "live_irrelevance", "live_relevance"):
        return [(e, None) for e in entries]
    truth = {g["id"]: g for g in b.utils.load_ground_truth_entry(category)}
    return [(e, truth[e["id"]]) for e in entries]


def tool_schemas(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools from BFCL function docs, by the package's own conversion for OpenAI models
    (dots in names become underscores, BFCL types become JSON-schema types)."""
    b = bfcl()
    tools = b.handler_utils.convert_to_tool(
        copy.deepcopy(functions), b.type_mappings.GORILLA_TO_OPENAPI, b.enums.ModelStyle.OPENAI_COMPLETIONS
    )
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def safe_call(name: str, arguments: Any, allowed: dict[str, set[str]]) -> str | None:
    """The call as the package executes it (``name(k=repr(v),...)``, its own ``convert_to_function_call``), or
    None when it cannot be executed safely: the package evaluates the string, so the name must be an offered
    function and every key an identifier among its parameters."""
    if name not in allowed or not _IDENT.fullmatch(name) or not isinstance(arguments, dict):
        return None
    if not all(isinstance(k, str) and _IDENT.fullmatch(k) and k in allowed[name] for k in arguments):
        return None
    calls: list[str] = bfcl().handler_utils.convert_to_function_call([{name: arguments}])
    return calls[0]


def allowed_calls(functions: list[dict[str, Any]], key: str = "properties") -> dict[str, set[str]]:
    """Function name (as offered, underscores for dots) → its parameter names (``key="required"``: the
    required ones)."""
    return {f["name"].replace(".", "_"): set((f.get("parameters") or {}).get(key) or []) for f in functions}


def entry_calls(entry: dict[str, Any]) -> dict[str, set[str]]:
    """Every function a multi-turn entry's classes expose to the policy: the offered ones and those miss_func
    holds back (the package's executor runs either; the held-back ones are merely not announced)."""
    allowed = allowed_calls(entry["function"])
    for missed in (entry.get("missed_function") or {}).values():
        allowed.update(allowed_calls(missed))
    return allowed


class Instances:
    """One episode's (or one grade's) instances of the API classes, by the package's own executor.

    The package keeps instances in its module's globals under ``MODEL_TESTID_CLASS_instance``; a fresh model
    name per episode keeps episodes apart, and `close` removes them."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.model_name = f"agentrft_{uuid.uuid4().hex}"
        category = entry["id"].rsplit("_", 1)[0]
        self.long_context = "long_context" in category or "composite" in category

    def execute(self, calls: list[str]) -> list[str]:
        results, _ = bfcl().multi_turn.execute_multi_turn_func_call(
            calls,
            self.entry.get("initial_config", {}),
            self.entry["involved_classes"],
            self.model_name,
            self.entry["id"],
            long_context=self.long_context,
            is_evaL_run=False,
        )
        return [str(r) for r in results]

    def close(self) -> None:
        release(self.model_name)


def release(model_name: str) -> None:
    """Drop the package's stored instances of one model name (its executor's globals)."""
    store = vars(bfcl().multi_turn)
    prefix = re.sub(r"[-./:]", "_", model_name)
    for key in [k for k in list(store) if k.startswith(prefix)]:  # list(): a snapshot, whatever other threads add
        store.pop(key, None)


def evaluate_single(entry: dict[str, Any], truth: dict[str, Any] | None, category: str, result: Any) -> dict[str, Any]:
    """The package's verdict on a single-turn result (a list of ``{name: arguments JSON}``, or the reply's text
    when it called nothing), by its AST or relevance evaluator."""
    b = bfcl()
    entry = copy.deepcopy(entry)
    if truth is None:
        return dict(
            b.runner._evaluate_single_relevance_entry(b.handler, entry["id"], result, entry, CHECKER_MODEL, category)
        )
    return dict(
        b.runner._evaluate_single_ast_entry(
            b.handler,
            entry["id"],
            result,
            truth["ground_truth"],
            entry,
            CHECKER_MODEL,
            category,
            language=b.enums.Language.PYTHON,
            return_format=b.enums.ReturnFormat.PYTHON,
            has_tool_call_tag=False,
        )
    )


def evaluate_multi_turn(
    entry: dict[str, Any], truth: dict[str, Any], category: str, result: list[list[Any]]
) -> dict[str, Any]:
    """The package's verdict on a multi-turn result (per user turn, per step: a list of ``{name: arguments
    JSON}``, or the reply's text), by its multi-turn evaluator (state and response checks, and the
    irrelevance check of the turns where nothing should be called)."""
    b = bfcl()
    model_name = f"agentrft_grade_{uuid.uuid4().hex}"
    try:
        verdict = b.runner._evaluate_single_multi_turn_entry(
            b.handler, entry["id"], result, truth["ground_truth"], copy.deepcopy(entry), model_name, category
        )
    finally:
        release(model_name)
    return dict(verdict)
