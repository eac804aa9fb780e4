"""`agentrft.inputs`: strict UTF-8, bounded nesting, finite numbers, no lone surrogates, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrft.inputs import (
    MAX_DEPTH,
    InputError,
    check_value,
    decode_text,
    loads_json,
    loads_toml,
    loads_yaml,
    read_json,
    read_jsonl,
    read_structured,
    read_text,
)


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------- encodings


def test_utf8_text_and_bom_are_read(tmp_path: Path) -> None:
    p = tmp_path / "a.json"
    p.write_bytes(b'\xef\xbb\xbf{"caf\xc3\xa9": 1}')
    assert read_json(p) == {"café": 1}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ('{"a": 1}'.encode("utf-16"), "not UTF-8 text (it looks like UTF-16; save it as UTF-8)"),
        ('{"a": 1}'.encode("utf-16-le"), "not UTF-8 text (a NUL byte at byte 2: a binary or UTF-16 file?)"),
        (b'{"a": "caf\xe9"}', "not UTF-8 text (byte 0xe9 at byte 11)"),
        (b'{"a": 1}\n{"b": "\xff"}', "not UTF-8 text (byte 0xff on line 2)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (a NUL byte on line 3: a binary or UTF-16 file?)"),
    ],
)
def test_not_utf8_is_one_clear_line(data: bytes, message: str) -> None:
    with pytest.raises(InputError) as exc:
        decode_text(data, "f.json")
    assert str(exc.value) == f"f.json: {message}"


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"absent\.json: no such file$"):
        read_text(tmp_path / "absent.json")
    with pytest.raises(InputError, match="is a directory, not a file$"):
        read_text(tmp_path)


# ---------------------------------------------------------------- values


def test_nesting_is_bounded_at_max_depth() -> None:
    check_value(nested(MAX_DEPTH))
    with pytest.raises(InputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        check_value(nested(MAX_DEPTH + 1), "x.json")
    for text in ("[" * 5000 + "]" * 5000, "[" * 100_000, '{"a":' * 3000 + "1" + "}" * 3000):
        with pytest.raises(InputError, match=f"^x.json: nested deeper than {MAX_DEPTH} levels"):
            loads_json(text, "x.json")  # past Python's recursion limit: no RecursionError escapes
    with pytest.raises(InputError, match="nested deeper"):
        loads_yaml("a: " + "[" * 5000 + "]" * 5000, "c.yaml")
    with pytest.raises(InputError, match="nested deeper"):
        loads_toml("a = " + "[" * 5000 + "]" * 5000, "c.toml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": [1, NaN]}', "field 'a[1]': NaN is not allowed"),
        ('{"a": {"b": Infinity}}', "field 'a.b': Infinity is not allowed"),
        ('{"a": -Infinity}', "field 'a': -Infinity is not allowed"),
        ('{"a": 1e999}', "field 'a': Infinity is not allowed"),
        ('{"a": 100000000000000000000000000000}', "field 'a': integer out of range (more than 64 bits)"),
        ('{"a": ' + "9" * 5000 + "}", "invalid JSON (a number with thousands of digits)"),
        ('{"a": "x\\ud800y"}', "field 'a': text holds a lone surrogate"),
        ('{"a": "\\udfff"}', "field 'a': text holds a lone surrogate"),
        ('{"\\ud800": 1}', "a key holds a lone surrogate"),
        ('{"a": {"\\ud800": 1}}', "field 'a': a key holds a lone surrogate"),
        ('{"a": 1,}', "invalid JSON (Expecting property name enclosed in double quotes at column 9)"),
    ],
)
def test_json_values_json_forbids_or_nothing_can_hold(text: str, message: str) -> None:
    with pytest.raises(InputError) as exc:
        loads_json(text, "d.jsonl:3")
    assert str(exc.value).startswith(f"d.jsonl:3: {message}")


def test_valid_edge_values_pass() -> None:
    value = loads_json('{"a": "\\ud83d\\ude00", "b": -9223372036854775808, "c": 9223372036854775807, "d": 1e308}')
    assert value["a"] == "\U0001f600" and value["b"] == -(2**63)
    check_value({"x": [None, True, 0.5, "é"]})


def test_yaml_and_toml_non_finite_and_aliases() -> None:
    with pytest.raises(InputError, match=r"^c\.yaml: field 'optimizer\.lr': NaN is not allowed"):
        loads_yaml("optimizer:\n  lr: .nan\n", "c.yaml")
    with pytest.raises(InputError, match=r"^c\.toml: field 'lr': Infinity is not allowed"):
        loads_toml("lr = inf\n", "c.toml")
    with pytest.raises(InputError, match=r"^c\.toml:1: invalid TOML \(Escaped character is not a Unicode scalar"):
        loads_toml('a = "\\ud800"\n', "c.toml")
    with pytest.raises(InputError, match=r"^c\.yaml: field \'a\': text holds a lone surrogate"):
        loads_yaml('a: "\\ud800"\n', "c.yaml")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8)
    )
    with pytest.raises(InputError, match="more than 1,000,000 values"):
        loads_yaml(bomb, "c.yaml")


def test_syntax_errors_name_the_line(tmp_path: Path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(InputError, match=r"c\.yaml:3: invalid YAML \(expected ',' or '\]'"):
        read_structured(y)
    j = tmp_path / "g.json"
    j.write_text('{\n  "a": 1\n  "b": 2\n}')
    with pytest.raises(InputError, match=r"g\.json:3: invalid JSON \(Expecting ',' delimiter at column 3\)$"):
        read_structured(j)
    t = tmp_path / "c.toml"
    t.write_text("a = 1\nb = \n")
    with pytest.raises(InputError, match=r"c\.toml:2: invalid TOML"):
        read_structured(t)


# ---------------------------------------------------------------- files


def test_empty_files_are_refused(tmp_path: Path) -> None:
    for name in ("e.json", "e.yaml", "e.toml"):
        (tmp_path / name).write_text(" \n")
        with pytest.raises(InputError, match="empty file"):
            read_structured(tmp_path / name)
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(InputError, match=r"e\.jsonl: empty file \(expected one JSON object per line\)"):
        read_jsonl(tmp_path / "e.jsonl")
    assert read_jsonl(tmp_path / "e.jsonl", allow_empty=True) == []


def test_jsonl_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"a": 1}) + "\n\n" + "[1]\n")
    with pytest.raises(InputError, match=r"d\.jsonl:3: expected a JSON object, got list$"):
        read_jsonl(p)
    p.write_text(json.dumps({"a": 1}) + "\n" + '{"b": NaN}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: field 'b': NaN is not allowed"):
        read_jsonl(p)
