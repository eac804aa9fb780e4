"""A job's body and files are checked before anything loads: one problem per fault, naming file, line and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentrft.rft.spec import JobSpecError, job_spec_from_flags, load_job_spec, parse_job_spec
from agentrft.rft.validate import validate_job
from agentrft.tools import sandbox

FIXTURES = Path(__file__).parent / "fixtures"
NO_SANDBOX = sandbox.backend_problem("auto")


def _job(tmp_path: Path, **changes: object) -> Path:
    """The fixture job copied to tmp_path (with its files), top-level fields replaced by ``changes``."""
    for name in ("train.jsonl", "valid.jsonl", "tools.py", "grader_all_types.json"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    body = json.loads((FIXTURES / "job.json").read_text())
    body.update(changes)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(body))
    return path


def _grader(body_path: Path, grader: dict) -> None:
    body = json.loads(body_path.read_text())
    body["method"]["reinforcement"]["grader"] = grader
    body_path.write_text(json.dumps(body))


def test_the_fixture_job_is_valid_and_paths_are_absolute(tmp_path: Path) -> None:
    spec = load_job_spec(_job(tmp_path))
    assert spec.training_file == str(tmp_path / "train.jsonl") and spec.agentrft.tools_module == str(
        tmp_path / "tools.py"
    )
    report = validate_job(spec, "job.json")
    assert report.problems == [] and report.ok
    assert (report.train_rows, report.valid_rows) == (4, 3)
    assert report.tools_declared == ["get_rate"] and report.tools_implemented == ["get_rate"]
    assert any("reasoning_effort='low' is not applicable" in n for n in report.notes)


@pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox backend for the python grader: {NO_SANDBOX}")
def test_every_documented_grader_type_in_a_multi_grader_validates(tmp_path: Path) -> None:
    path = _job(tmp_path)
    _grader(path, json.loads((FIXTURES / "grader_all_types.json").read_text()))
    # a hosted score_model names no endpoint: the job says where its judge is
    problems = [str(p) for p in validate_job(load_job_spec(path), str(path)).problems]
    assert problems == [
        f"{path}: field 'method.reinforcement.grader.graders.judge.base_url': no judge endpoint: set base_url in "
        "the spec or LoadOptions (or agentrft.grader_base_url in the job)"
    ]
    body = json.loads(path.read_text())
    body["agentrft"]["grader_base_url"] = "http://127.0.0.1:9/v1"  # not called while validating
    path.write_text(json.dumps(body))
    spec = load_job_spec(path)
    assert spec.grader["graders"]["judge"]["base_url"] == "http://127.0.0.1:9/v1"
    assert validate_job(spec, str(path)).problems == []


@pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox backend for the python grader: {NO_SANDBOX}")
def test_a_python_grader_without_grade_fails_here(tmp_path: Path) -> None:
    path = _job(tmp_path)
    grader = json.loads((FIXTURES / "grader_all_types.json").read_text())
    grader["graders"]["numeric"]["source"] = "def score(sample, item):\n    return 1.0\n"
    grader["graders"]["judge"]["base_url"] = "http://127.0.0.1:9/v1"
    _grader(path, grader)
    report = validate_job(load_job_spec(path), str(path))
    assert [str(p) for p in report.problems] == [
        f"{path}: field 'method.reinforcement.grader.graders.numeric.source': defines no grade(sample, item) "
        "function (no def, assignment or import binds it; every call would fail)"
    ]


def test_each_bad_row_is_one_problem_naming_file_line_and_field(tmp_path: Path) -> None:
    path = _job(tmp_path)
    rows = (tmp_path / "train.jsonl").read_text().splitlines()
    good = json.loads(rows[0])
    last_assistant = {**good, "messages": [*good["messages"], {"role": "assistant", "content": "12"}]}
    bad_tool = json.loads(rows[1])
    bad_tool["tools"][0]["function"]["parameters"] = {"type": "object", "properties": {"base": {"type": 3}}}
    no_answer = {k: v for k, v in json.loads(rows[2]).items() if k != "answer"}
    null_pair = {**json.loads(rows[3]), "answer": None}
    (tmp_path / "train.jsonl").write_text(
        "\n".join(
            [
                rows[0],
                "[1, 2]",
                json.dumps(last_assistant),
                json.dumps(bad_tool),
                json.dumps(no_answer),
                "",
                json.dumps(null_pair),
                "{not json",
            ]
        )
        + "\n"
    )
    report = validate_job(load_job_spec(path), str(path))
    train = tmp_path / "train.jsonl"
    assert [str(p) for p in report.problems] == [
        f"{train}:2: expected a JSON object, got list",
        f"{train}:3: field 'messages': the last message must be from the user, not 'assistant'",
        f"{train}:4: field 'tools[0].function.parameters.properties.base.type': not a valid JSON Schema: "
        "3 is not valid under any of the given schemas",
        f"{train}:5: field 'answer': is missing or null, but the grader reads {{{{ item.answer }}}} "
        "(method.reinforcement.grader.graders.exact.reference)",
        f"{train}:7: field 'answer': is missing or null, but the grader reads {{{{ item.answer }}}} "
        "(method.reinforcement.grader.graders.exact.reference)",
        f"{train}:8: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
    ]


def test_item_paths_reserved_keys_and_sample_fields(tmp_path: Path) -> None:
    path = _job(tmp_path)
    _grader(
        path,
        {
            "type": "multi",
            "graders": {
                "pair": {
                    "type": "string_check",
                    "input": "{{ item.pair.base }}/{{ item.pair.quotes[0] }}",
                    "reference": "{{ item.messages }}",
                    "operation": "eq",
                },
                "typo": {
                    "type": "string_check",
                    "input": "{{ sample.output_txt }}",
                    "reference": "{{ sample.output_tools[0].function.name }}",
                    "operation": "eq",
                },
            },
            "calculate_output": "pair + typo",
        },
    )
    problems = [str(p) for p in validate_job(load_job_spec(path), "job.json").problems]
    train, valid = tmp_path / "train.jsonl", tmp_path / "valid.jsonl"
    assert problems[1] == (
        f"{train}:1: field 'pair.quotes[0]': is missing or null, but the grader reads {{{{ item.pair.quotes[0] }}}} "
        "(method.reinforcement.grader.graders.pair.input)"
    )
    assert (
        f"{valid}:3: field 'messages': is reserved for the prompt and not part of the grader's item, but the grader "
        "reads {{ item.messages }} (method.reinforcement.grader.graders.pair.reference)"
    ) in problems
    assert problems[0] == (  # the job's own problems first, then each file's in line order
        "job.json: field 'method.reinforcement.grader.graders.typo.input': {{ sample.output_txt }}: a sample has "
        "output_text, output_json, output_tools, choices, trajectory"
    )
    # item.pair.base is in every row and sample.output_tools is a sample field: no problem for them
    assert len(problems) == 2 * 7 + 1 and not any("pair.base" in p or "output_tools[0]" in p for p in problems)


def test_empty_and_missing_files_and_a_broken_tool_setup(tmp_path: Path) -> None:
    path = _job(tmp_path)
    (tmp_path / "valid.jsonl").write_text("\n\n")
    body = json.loads(path.read_text())
    body["training_file"] = "nowhere.jsonl"
    body["agentrft"] = {
        "tools_module": "tools.py",
        "tool_endpoints": {"get_rate": "http://127.0.0.1:9/rate", "x": "http://h/x"},
    }
    path.write_text(json.dumps(body))
    problems = [str(p) for p in validate_job(load_job_spec(path), "job.json").problems]
    assert problems == [
        "job.json: field 'agentrft.tool_endpoints.get_rate': no row declares a tool named 'get_rate'",
        "job.json: field 'agentrft.tool_endpoints.x': no row declares a tool named 'x'",
        f"{tmp_path / 'nowhere.jsonl'}: no such file",
        f"{tmp_path / 'valid.jsonl'}: empty file (expected one RFT row per line)",
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": "o4-mini-2025-04-16"}, "field 'model': 'o4-mini-2025-04-16' is not a model agentrft trains here"),
        ({"training_file": "file-abc123"}, "field 'training_file': 'file-abc123' looks like an uploaded-file id"),
        ({"suffix": "has space"}, "field 'suffix': must be 1-64 letters, digits, '-' or '_'"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "field 'metadata': at most 16 pairs, not 17"),
        ({"seed": -1}, "field 'seed': Input should be greater than or equal to 0"),
        ({"hyperparameters": {"n_epochs": 2}}, "field 'hyperparameters': give them as method.reinforcement"),
        ({"integrations": []}, "field 'integrations': not supported locally"),
        ({"extra": 1}, "field 'extra': unknown field"),
        (
            {"method": {"type": "supervised", "supervised": {}}},
            "field 'method.type': 'supervised' jobs do not run here",
        ),
    ],
)
def test_bad_bodies_name_the_field(tmp_path: Path, change: dict, message: str) -> None:
    path = _job(tmp_path, **change)
    with pytest.raises(JobSpecError) as err:
        load_job_spec(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


@pytest.mark.parametrize(
    ("hp", "message"),
    [
        ({"batch_size": 0}, "batch_size': must be 'auto' or an integer >= 1 and <= 100000, not 0"),
        ({"n_epochs": 1.5}, "n_epochs': must be 'auto' or an integer >= 1"),
        ({"learning_rate_multiplier": 0}, "learning_rate_multiplier': must be 'auto' or a number > 0"),
        ({"compute_multiplier": "lots"}, "compute_multiplier': must be 'auto' or a number > 0"),
        ({"eval_interval": True}, "eval_interval': must be 'auto' or an integer >= 1"),
        ({"reasoning_effort": "max"}, "reasoning_effort': Input should be 'default', 'low', 'medium' or 'high'"),
        ({"beta": 0.1}, "beta': unknown field"),
    ],
)
def test_bad_hyperparameters_name_the_field(tmp_path: Path, hp: dict, message: str) -> None:
    body = json.loads((FIXTURES / "job.json").read_text())
    body["method"]["reinforcement"]["hyperparameters"] = hp
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(body, "job.json", FIXTURES)
    assert str(err.value).startswith(f"job.json: field 'method.reinforcement.hyperparameters.{message}"), str(err.value)


def test_a_job_from_flags_reads_the_grader_file(tmp_path: Path) -> None:
    grader = tmp_path / "grader.yaml"
    grader.write_text(
        "type: string_check\ninput: '{{ sample.output_text }}'\nreference: '{{ item.answer }}'\noperation: eq\n"
    )
    spec = job_spec_from_flags(
        model="tiny",
        training_file=str(FIXTURES / "train.jsonl"),
        validation_file=str(FIXTURES / "valid.jsonl"),
        grader=str(grader),
        hyperparameters=["n_epochs=2", "batch_size=auto", "learning_rate_multiplier=0.5"],
        seed=4,
        suffix=None,
    )
    hp = spec.hyperparameters
    assert (hp.n_epochs, hp.batch_size, hp.learning_rate_multiplier, spec.seed) == (2, "auto", 0.5, 4)
    assert spec.grader["type"] == "string_check"
    assert validate_job(spec, "flags").ok
    with pytest.raises(JobSpecError, match="^flags: --validation-file, --grader missing"):
        job_spec_from_flags(
            model="tiny",
            training_file="t.jsonl",
            validation_file=None,
            grader=None,
            hyperparameters=[],
            seed=None,
            suffix=None,
        )


@pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox backend for the python grader: {NO_SANDBOX}")
def test_agentrft_train_refuses_a_python_grader_without_grade_before_the_model_loads(tmp_path, monkeypatch) -> None:
    """The report that started it: such a spec used to reach the training loop and run steps on the real model."""
    from typer.testing import CliRunner

    from agentrft.cli.main import app
    from agentrft.samplers import policies

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(policies, "load_model_and_tokenizer", no_model)
    monkeypatch.setattr(policies, "load_trainable_policy", no_model)
    config = tmp_path / "config.yaml"
    config.write_text(
        json.dumps(
            {
                "policy": {"name": "smollm2-135m"},
                "rollout": {
                    "env": f"jsonl:{FIXTURES / 'train.jsonl'}",
                    "grader": {"type": "python", "source": "def score(sample, item):\n    return 1.0\n"},
                },
            }
        )
    )
    result = CliRunner().invoke(app, ["train", str(config), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {config}: rollout.grader: source: defines no grade(sample, item) function "
        "(no def, assignment or import binds it; every call would fail)\n"
    )
    assert not (tmp_path / "run").exists()
