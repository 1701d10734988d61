"""JSONL readers: line-numbered errors for inputs, torn-last-line tolerance for append-only logs."""

import logging

import pytest

from a2c_ppo_acktr.common.jsonl import JsonlError, iter_jsonl, read_log


def test_iter_jsonl_numbers_lines_and_names_bad_ones(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"b": 2}\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"b": 2})]
    path.write_text('{"a": 1}\n{"b": \n', encoding="utf-8")
    with pytest.raises(JsonlError, match=r"rows\.jsonl:2 is not valid JSON .*; rebuild it"):
        list(iter_jsonl(path, fix="rebuild it"))
    path.write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(JsonlError, match=r":2 is a JSON list, expected an object"):
        list(iter_jsonl(path))
    with pytest.raises(FileNotFoundError):
        list(iter_jsonl(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize(
    "data, rows, kept",
    [
        (b"", [], b""),
        (b'{"a": 1}\n{"b": 2}\n', [{"a": 1}, {"b": 2}], b'{"a": 1}\n{"b": 2}\n'),
        (b'{"a": 1}\n{"b": 2', [{"a": 1}], b'{"a": 1}\n'),  # parseable but without its newline: torn
        (b'{"a": 1}\n\n{"b"', [{"a": 1}], b'{"a": 1}\n\n'),
        (b'{"a": 1', [], b""),
    ],
)
def test_read_log_drops_and_repairs_a_torn_last_line(tmp_path, caplog, data, rows, kept):
    path = tmp_path / "log.jsonl"
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING):
        assert read_log(path) == rows
    assert path.read_bytes() == data  # reading alone never writes
    assert ("torn last line" in caplog.text) == (data != kept)
    assert read_log(path, repair=True) == rows
    assert path.read_bytes() == kept
    with open(path, "ab") as f:  # appending after a repair gives a well-formed file
        f.write(b'{"c": 3}\n')
    assert read_log(path) == rows + [{"c": 3}]


def test_read_log_raises_on_a_bad_complete_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(JsonlError, match=r"log\.jsonl:2 is not valid JSON"):
        read_log(path, repair=True)
    assert path.read_bytes() == b'{"a": 1}\nnot json\n{"b": 2}\n'  # corruption is never "repaired" away
    assert read_log(tmp_path / "missing.jsonl") == []
