"""Keys and values render as text when they are printable UTF-8, whatever their length; 8-byte ones keep an int64 reading."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

import snapshot as s
from clink.cli.common import EXIT_NEGATIVE, EXIT_OK
from clink.tools import projections as p
from tests.cli_fixtures import write_table

OP = s.operator_id("word-count")


def _int(n: int) -> bytes:
    return struct.pack("<q", n)


def _le(b: bytes) -> int:
    return int(struct.unpack("<q", b)[0])


@pytest.mark.parametrize(
    ("raw", "text", "int64"),
    [
        (b"subtasks", "subtasks", _le(b"subtasks")),  # the demo's word: 8 printable bytes are text, the int64 reading stays
        (b"user-179", "user-179", _le(b"user-179")),
        (b"new-user", "new-user", _le(b"new-user")),
        ("ключ".encode(), "ключ", _le("ключ".encode())),  # 8 bytes of Cyrillic
        (_int(42), "42", 42),  # a counter: NUL bytes are control characters, so not text
        (_int(-1), "-1", -1),
        (b"tab\there", str(_le(b"tab\there")), _le(b"tab\there")),  # a control character: 8 bytes read as int64
        (b"a", "a", None),
        (b"user-1790", "user-1790", None),
        (b"a b", "a b", None),
        (b"", "0x", None),  # at least one character
        (b"   ", "0x202020", None),  # not only spaces (an invisible cell says nothing)
        (b"\xff\xfe", "0xfffe", None),  # not UTF-8
        (b"line\n", "0x6c696e650a", None),
        ("\u00a0x".encode(), "0xc2a078", None),  # a non-ASCII space is a separator, not printable
    ],
)
def test_render_bytes(raw: bytes, text: str, int64: int | None) -> None:
    rendered, ints = p.render_bytes(pa.array([raw], pa.binary()))
    assert rendered.to_pylist() == [text]
    assert ints.to_pylist() == [int64]


def test_render_bytes_on_chunked_and_sliced_input() -> None:
    values = [b"subtasks", _int(7), b"\x00\x01", b"x"] * 50
    arr = pa.chunked_array([pa.array(values[:77], pa.binary()), pa.array(values[77:], pa.binary())])
    text, ints = p.render_bytes(arr)
    assert text.to_pylist() == ["subtasks", "7", "0x0001", "x"] * 50
    sliced, _ = p.render_bytes(pa.array(values, pa.binary()).slice(1, 3))
    assert sliced.to_pylist() == ["7", "0x0001", "x"]


@pytest.fixture
def words_snapshot(tmp_path):
    """A word count as the demo writes it: 8-letter words, user ids and int64 counts; one text value."""
    rows = {
        s.encode_keyed_key("count", b"subtasks"): _int(3),
        s.encode_keyed_key("count", b"user-179"): _int(17),
        s.encode_keyed_key("count", b"new-user"): _int(1),
        s.encode_keyed_key("count", _int(99)): _int(5),
        s.encode_keyed_key("profile", b"u-1"): b"greeting",
    }
    table = pa.table(
        {
            "op_id": pa.array([OP] * len(rows), pa.uint64()),
            "key_bytes": pa.array(list(rows), pa.binary()),
            "value_bytes": pa.array(list(rows.values()), pa.binary()),
        }
    )
    return write_table(tmp_path / "words.snap", table, None)


def test_state_cat_shows_words_as_words(cwd_tmp, tmp_tree, clink_run, words_snapshot) -> None:
    before = tmp_tree()
    result = clink_run("state-cat", str(words_snapshot), "-o", "json", "-n", "0")
    assert result.exit_code == EXIT_OK, result.output
    rows = {r["user_key"]: r for r in json.loads(result.stdout)["rows"]}
    assert {"subtasks", "user-179", "new-user", "99", "u-1"} == set(rows)
    assert rows["subtasks"]["value"] == "3" and rows["subtasks"]["user_key_hex"] == b"subtasks".hex()
    assert rows["u-1"]["value"] == "greeting"  # an 8-byte text value is text too
    text = clink_run("state-cat", str(words_snapshot)).stdout
    assert "subtasks" in text and "user-179" in text and str(_le(b"subtasks")) not in text
    assert tmp_tree() == before


def test_state_query_finds_text_keys_and_keeps_the_int64_reading(cwd_tmp, tmp_tree, clink_run, words_snapshot) -> None:
    before = tmp_tree()
    sql = "SELECT key_text, key_int64, value_text, value_int64 FROM state WHERE key_text = 'new-user'"
    result = clink_run("state-query", str(words_snapshot), sql, "-o", "json")
    assert result.exit_code == EXIT_OK, result.output
    assert json.loads(result.stdout)["rows"] == [
        {"key_text": "new-user", "key_int64": _le(b"new-user"), "value_text": "1", "value_int64": 1}
    ]
    result = clink_run("state-query", str(words_snapshot), "SELECT key_text FROM state WHERE key_int64 = 99", "-o", "json")
    assert json.loads(result.stdout)["rows"] == [{"key_text": "99"}]
    result = clink_run("state-query", str(words_snapshot), "SELECT value_int64 FROM state WHERE value_text = 'greeting'", "-o", "json")
    assert json.loads(result.stdout)["rows"] == [{"value_int64": _le(b"greeting")}]
    assert tmp_tree() == before


def test_state_diff_names_text_keys(tmp_path, clink_run, words_snapshot) -> None:
    changed = s.read_snapshot(words_snapshot.read_bytes()).table
    values = changed.column("value_bytes").to_pylist()
    keys = changed.column("key_bytes").to_pylist()
    values[keys.index(s.encode_keyed_key("count", b"user-179"))] = _int(18)
    other = write_table(tmp_path / "other.snap", changed.set_column(2, "value_bytes", pa.array(values, pa.binary())), None)
    result = clink_run("state-diff", str(words_snapshot), str(other), "-o", "json")
    assert result.exit_code == EXIT_NEGATIVE, result.output
    entries = json.loads(result.stdout)["entries"]
    assert [(e["user_key"], e["value_a"], e["value_b"]) for e in entries] == [("user-179", "17", "18")]


@pytest.mark.parametrize("command", ["state-cat", "state-query", "state-diff"])
def test_the_help_says_what_printable_means(clink_run, command) -> None:
    text = " ".join(clink_run(command, "--help").stdout.split())
    assert "printable UTF-8" in text and "not a space" in text and "control" in text and "int64" in text


def test_displays_quote_text_that_reads_as_a_number_or_hex() -> None:
    """The text key "12345678" and the int64 key 12345678 look different in state-cat and state-diff; key_text does not change."""
    raws = [b"12345678", _int(12345678), b"0xff", b"-7", b"user-7", b"", b"12 apples"]
    shown, _ = p.render_bytes(pa.array(raws, pa.binary()), quote_lookalikes=True)
    assert shown.to_pylist() == ['"12345678"', "12345678", '"0xff"', '"-7"', "user-7", "0x", "12 apples"]
    plain, _ = p.render_bytes(pa.array(raws, pa.binary()))
    assert plain.to_pylist()[:4] == ["12345678", "12345678", "0xff", "-7"]  # the query projection's key_text keeps the text


def test_state_cat_shows_a_numeric_text_key_quoted(tmp_path) -> None:
    from click.testing import CliRunner

    from clink.cli.state import cli

    keys = [s.encode_keyed_key("count", b"12345678"), s.encode_keyed_key("count", _int(12345678))]
    table = pa.table(
        {
            "op_id": pa.array([OP, OP], pa.uint64()),
            "key_bytes": pa.array(keys, pa.binary()),
            "value_bytes": pa.array([b"v", b"w"], pa.binary()),
        }
    )
    path = write_table(tmp_path / "s.arrow", table, s.StateVersionMap({}))
    out = CliRunner().invoke(cli, ["state-cat", str(path), "-o", "json"])
    assert out.exit_code == EXIT_OK, out.output
    shown = {row["user_key_hex"]: row["user_key"] for row in json.loads(out.stdout)["rows"]}
    assert shown == {b"12345678".hex(): '"12345678"', _int(12345678).hex(): "12345678"}
