"""Reading files a user hands us: regular files only, bounded, strict YAML and JSON."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from common.userfiles import (
    MAX_DIGITS,
    MAX_VALUES,
    ParseError,
    UnreadableError,
    decimal,
    parse_yaml,
    read_text,
    shown,
    why_not_writable,
    write_atomically,
)


def test_a_regular_file_is_read_and_one_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x" * 2048)

    assert read_text(path, limit=2048) == "x" * 2048
    with pytest.raises(UnreadableError, match="over 1 KiB"):
        read_text(path, limit=1024)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    with pytest.raises(UnreadableError, match="a FIFO, not a regular file"):
        read_text(fifo)


def test_a_socket_is_named_as_one(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(UnreadableError, match="a socket, not a regular file"):
            read_text(tmp_path / "sock")


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(UnreadableError, match="No such file or directory"):
        read_text(tmp_path / "absent")


@pytest.mark.parametrize(
    "text",
    ["a: 1\na: 2\n", "{a: 1, a: 2}\n", '{"a": 1, "a": 2}', "x:\n  - {b: 1, c: 2, b: 3}\n"],
)
def test_a_key_given_twice_is_refused(text: str) -> None:
    with pytest.raises(ParseError, match="given twice: keep one"):
        parse_yaml(text)


def test_a_merge_key_is_not_a_key_given_twice() -> None:
    text = "base: &b {x: 1, y: 2}\nover:\n  <<: *b\n  y: 3\n"

    assert parse_yaml(text)["over"] == {"x": 1, "y": 3}


@pytest.mark.parametrize("number", ["9" * (MAX_DIGITS + 1), "-" + "9" * (MAX_DIGITS + 1)])
def test_a_number_with_too_many_digits_is_refused(number: str) -> None:
    with pytest.raises(ParseError, match=f"at most {MAX_DIGITS}"):
        parse_yaml(f"n: {number}\n")
    with pytest.raises(ParseError, match=f"at most {MAX_DIGITS}"):
        parse_yaml(f'{{"n": {number}}}')


def test_long_but_legal_numbers_and_json_that_is_yaml_parse() -> None:
    assert parse_yaml(f"n: {'9' * MAX_DIGITS}\n") == {"n": int("9" * MAX_DIGITS)}
    assert parse_yaml('{"a": [1, 2.5, true]}') == {"a": [1, 2.5, True]}
    assert parse_yaml("{a: b}") == {"a": "b"}  # flow YAML that is not JSON


def test_why_not_writable_names_a_missing_dir_and_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")

    assert why_not_writable(tmp_path) is None
    assert why_not_writable(tmp_path / "absent") == "does not exist"
    assert why_not_writable(tmp_path / "file") == "is a regular file, not a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # its trial file is gone


def test_why_not_writable_tries_a_dir_that_permissions_allow() -> None:
    # root passes access() on /proc, whose root refuses any new file: only a try tells
    why = why_not_writable(Path("/proc"))

    assert why is not None
    assert why.startswith("refuses a new file (") or why == "is not writable by this process"


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "\n".join(lines) + f"\nversion: *a{levels - 1}\n"


def test_aliases_that_expand_past_the_limit_are_refused_before_anything_is_built() -> None:
    text = _alias_bomb(9)  # ~500 bytes standing for 10^9 values

    with pytest.raises(
        ParseError, match=f"its aliases expand to .* values \\(at most {MAX_VALUES}"
    ):
        parse_yaml(text)


def test_aliases_within_the_limit_are_expanded() -> None:
    assert len(parse_yaml(_alias_bomb(3))["version"]) == 10


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42), ("0", 0), ("²", None), ("٣", None), ("-1", None), ("", None), ("9" * 21, None)],
)
def test_decimal_takes_ascii_digits_only(text: str, value: int | None) -> None:
    assert decimal(text) == value


def test_shown_cuts_long_values_and_big_structures() -> None:
    assert len(shown("x" * 10**6)) < 120
    assert "(1000000 characters)" in shown("x" * 10**6)
    assert len(shown(list(range(10**6)))) < 60
    assert shown("ok") == "'ok'"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a: 1\n---\nb: 2\n", "expected a single document in the stream, but found another"),
        ("a: \x00\n", "character #x0000 at position 3 is not allowed in YAML"),
    ],
)
def test_yaml_errors_are_one_whole_sentence(text: str, said: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_yaml(text)

    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("token: !S3CRET-tag x\n", "for the tag (text of 11 characters)"),
        ("a: [1, 2\n", "did not find expected ',' or ']'"),  # its own tokens stay quoted
    ],
)
def test_yaml_errors_describe_what_they_would_quote_of_the_file(text: str, said: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_yaml(text)

    assert said in str(caught.value)
    assert "S3CRET" not in str(caught.value)


def test_yaml_is_read_as_yaml_1_2_reads_it() -> None:
    text = "a: yes\nb: on\nc: true\nd: 017\ne: 0o17\nf: 0x1f\ng: 1:30\nh: -5\n"

    assert parse_yaml(text) == {
        "a": "yes", "b": "on", "c": True, "d": 17, "e": 15, "f": 31, "g": "1:30", "h": -5,
    }  # fmt: skip


def test_a_file_replaced_keeps_its_permissions_and_a_new_one_is_0644(tmp_path: Path) -> None:
    kept, new = tmp_path / "env", tmp_path / "new"
    kept.write_text("old\n")
    kept.chmod(0o600)

    write_atomically(kept, "A=1\n")
    write_atomically(new, "B=2\n")

    assert (kept.read_text(), stat.S_IMODE(kept.stat().st_mode)) == ("A=1\n", 0o600)
    assert (new.read_text(), stat.S_IMODE(new.stat().st_mode)) == ("B=2\n", 0o644)


def test_a_tab_where_yaml_wants_spaces_says_so() -> None:
    with pytest.raises(ParseError) as caught:
        parse_yaml("config:\n\tlingjun-rdma:x: 1\n")

    assert str(caught.value).endswith(": YAML indents with spaces, not tabs")


def test_another_yaml_slip_gets_no_tab_hint() -> None:
    with pytest.raises(ParseError) as caught:
        parse_yaml("a: [1,\n")

    assert "tabs" not in str(caught.value)
