"""Text graders: `string_check`, `text_similarity`, `json_schema`.

text_similarity metric choices (documented, SPECS §1):
- `fuzzy_match`: `rapidfuzz.fuzz.ratio / 100` (normalised Indel similarity).
- `bleu`: sacrebleu `sentence_bleu` (13a tokenisation, exp smoothing) / 100.
- `gleu`: nltk `sentence_gleu` (Google-BLEU, n = 1..4) on lower-cased whitespace tokens.
- `meteor`: nltk `meteor_score` with exact and Porter-stem matching. WordNet
  synonym matching is used only when the wordnet corpus is installed; this
  host cannot download it, so by default a stub with no synonyms stands in
  (scores can be lower than reference METEOR for paraphrases). The mode used is
  in `Grade.metadata["meteor_synonyms"]`.
- `rouge_1`…`rouge_5`, `rouge_l`: rouge-score F-measure, no stemming.
`cosine` needs embeddings and is refused at load time.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from agentrft.graders.base import Grader, GraderSpecError, Sample, Score
from agentrft.graders.registry import LoadOptions, SpecBase, register_grader
from agentrft.graders.template import compile_template


class StringCheckSpec(SpecBase):
    type: Literal["string_check"]
    input: str
    reference: str
    operation: Literal["eq", "ne", "like", "ilike"]


@register_grader("string_check")
class StringCheckGrader(Grader):
    """1.0 or 0.0: `eq`/`ne` case-sensitive; `like` = input contains reference; `ilike` case-insensitively."""

    Spec = StringCheckSpec

    def __init__(
        self,
        name: str,
        input: str,
        reference: str,
        operation: str,
        where: str = "",
        pass_threshold: float | None = None,
    ) -> None:
        super().__init__(name, pass_threshold)
        self.input = compile_template(input, f"{where}.input" if where else "input")
        self.reference = compile_template(reference, f"{where}.reference" if where else "reference")
        self.operation = operation
        self._op = {
            "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b,
            "like": lambda a, b: b in a,
            "ilike": lambda a, b: b.casefold() in a.casefold(),
        }[operation]

    @classmethod
    def build(cls, spec: StringCheckSpec, where: str, options: LoadOptions) -> StringCheckGrader:
        return cls(spec.name or "string_check", spec.input, spec.reference, spec.operation, where, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        ok = self._op(self.input.render(sample, item), self.reference.render(sample, item))
        return Score(1.0 if ok else 0.0)


Metric = Literal[
    "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l", "cosine"
]


class TextSimilaritySpec(SpecBase):
    type: Literal["text_similarity"]
    input: str
    reference: str
    evaluation_metric: Metric


class _NoSynonyms:
    """Stand-in for nltk's wordnet when the corpus is not installed: no synonym matches."""

    @staticmethod
    def synsets(*_: Any, **__: Any) -> list[Any]:
        return []


def _wordnet() -> tuple[Any, bool]:
    try:
        from nltk.corpus import wordnet

        wordnet.synsets("test")
        return wordnet, True
    except LookupError:
        return _NoSynonyms(), False


@register_grader("text_similarity")
class TextSimilarityGrader(Grader):
    """Similarity in [0, 1]; success when it reaches `pass_threshold` (default 1.0)."""

    Spec = TextSimilaritySpec

    def __init__(
        self, name: str, input: str, reference: str, metric: str, where: str = "", pass_threshold: float | None = None
    ) -> None:
        super().__init__(name, pass_threshold)
        pre = f"{where}." if where else ""
        if metric == "cosine":
            raise GraderSpecError(
                f"{pre}evaluation_metric",
                "cosine needs an embedding model, which agentrft does "
                "not ship; use fuzzy_match, bleu, gleu, meteor or rouge_*",
            )
        self.input = compile_template(input, f"{pre}input")
        self.reference = compile_template(reference, f"{pre}reference")
        self.metric = metric
        self._meta: dict[str, Any] = {}
        self._fn = self._make(metric)

    @classmethod
    def build(cls, spec: TextSimilaritySpec, where: str, options: LoadOptions) -> TextSimilarityGrader:
        return cls(
            spec.name or "text_similarity",
            spec.input,
            spec.reference,
            spec.evaluation_metric,
            where,
            spec.pass_threshold,
        )

    def _make(self, metric: str) -> Any:
        if metric == "fuzzy_match":
            from rapidfuzz import fuzz

            return lambda a, b: fuzz.ratio(a, b) / 100.0
        if metric == "bleu":
            from sacrebleu.metrics import BLEU

            bleu = BLEU(effective_order=True)
            return lambda a, b: bleu.sentence_score(a, [b]).score / 100.0
        if metric == "gleu":
            from nltk.translate.gleu_score import sentence_gleu

            return lambda a, b: float(sentence_gleu([b.lower().split()], a.lower().split()))
        if metric == "meteor":
            from nltk.stem.porter import PorterStemmer
            from nltk.translate.meteor_score import meteor_score

            wn, real = _wordnet()
            self._meta = {"meteor_synonyms": "wordnet" if real else "none (wordnet corpus not installed)"}
            stemmer = PorterStemmer()
            return lambda a, b: float(meteor_score([b.lower().split()], a.lower().split(), stemmer=stemmer, wordnet=wn))
        from rouge_score import rouge_scorer

        key = "rougeL" if metric == "rouge_l" else "rouge" + metric[-1]
        scorer = rouge_scorer.RougeScorer([key], use_stemmer=False)
        return lambda a, b: scorer.score(b, a)[key].fmeasure

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        a, b = self.input.render(sample, item), self.reference.render(sample, item)
        value = 0.0 if not a.strip() or not b.strip() else float(self._fn(a, b))
        return Score(min(1.0, max(0.0, value)), metadata=dict(self._meta) if self._meta else None)


class JsonSchemaSpec(SpecBase):
    type: Literal["json_schema"]
    input: str = "{{ sample.output_text }}"
    json_schema: dict[str, Any]


@register_grader("json_schema")
class JsonSchemaGrader(Grader):
    """1.0 when the input is valid JSON matching `json_schema` (jsonschema, draft from `$schema`, else 2020-12).

    Invalid JSON or a schema violation is a wrong answer (0, reason in metadata),
    not a grader error: the policy is being graded on exactly that.
    """

    Spec = JsonSchemaSpec

    def __init__(
        self, name: str, input: str, schema: dict[str, Any], where: str = "", pass_threshold: float | None = None
    ) -> None:
        super().__init__(name, pass_threshold)
        import jsonschema
        from jsonschema.validators import validator_for

        pre = f"{where}." if where else ""
        self.input = compile_template(input, f"{pre}input")
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise GraderSpecError(f"{pre}json_schema", f"invalid JSON schema: {e.message}") from None
        self._validator = cls(schema)

    @classmethod
    def build(cls, spec: JsonSchemaSpec, where: str, options: LoadOptions) -> JsonSchemaGrader:
        return cls(spec.name or "json_schema", spec.input, spec.json_schema, where, spec.pass_threshold)

    def score(self, sample: Sample, item: dict[str, Any]) -> Score:
        raw = self.input.value(sample, item)
        if isinstance(raw, str):
            try:
                raw = json.loads(_strip_fence(raw))
            except ValueError as e:
                return Score(0.0, metadata={"reason": f"not JSON: {e}"})
        err = next(iter(self._validator.iter_errors(raw)), None)
        if err is not None:
            return Score(0.0, metadata={"reason": f"schema violation at {err.json_path}: {err.message}"})
        return Score(1.0)


def _strip_fence(text: str) -> str:
    s = text.strip()
    if s.startswith("```"):
        s = s.split("\n", 1)[1] if "\n" in s else ""
        if s.rstrip().endswith("```"):
            s = s.rstrip()[:-3]
    return s
