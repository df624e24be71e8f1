"""The server-side CommandParser: as Go's nsqd, a command is a ``\n``-terminated line (a
trailing ``\r`` dropped) split on single spaces, and IDENTIFY, AUTH, PUB, MPUB and DPUB are
followed by ``BE32(size)`` and a body."""

from __future__ import annotations

import pytest

from nsqpy.protocol import Command, CommandParser, LineTooLong, commands
from nsqpy.protocol.commands import MAX_LINE_LENGTH

MAX_MSG = 100
MAX_BODY = 1000


def parser() -> CommandParser:
    return CommandParser(max_msg_size=MAX_MSG, max_body_size=MAX_BODY)


def shape(cmds: list[Command]) -> list[tuple[bytes, list[bytes], bytes | None, int | None]]:
    return [(c.name, c.params, c.body, c.bad_body_size) for c in cmds]


def feed_bytewise(p: CommandParser, data: bytes) -> list[Command]:
    out: list[Command] = []
    for i in range(len(data)):
        out += p.feed(data[i : i + 1])
    return out


# --------------------------------------------------------------------------- lines


def test_command_without_body() -> None:
    assert shape(parser().feed(b"NOP\n")) == [(b"NOP", [], None, None)]


def test_params_are_split_on_single_spaces() -> None:
    assert shape(parser().feed(b"SUB T ch\n")) == [(b"SUB", [b"T", b"ch"], None, None)]


def test_consecutive_spaces_give_empty_params() -> None:
    cmds = parser().feed(b"SUB  T ch\nRDY \nREQ id  5\n")
    assert [(c.name, c.params) for c in cmds] == [
        (b"SUB", [b"", b"T", b"ch"]),
        (b"RDY", [b""]),
        (b"REQ", [b"id", b"", b"5"]),
    ]


def test_leading_space_gives_empty_name() -> None:
    assert shape(parser().feed(b" NOP\n")) == [(b"", [b"NOP"], None, None)]


def test_empty_lines_are_empty_commands() -> None:
    # Go's TestEmptyCommand: "\n\n" -> the server answers "E_INVALID invalid command " (empty name)
    assert shape(parser().feed(b"\n\n")) == [(b"", [], None, None), (b"", [], None, None)]


def test_trailing_cr_is_stripped() -> None:
    cmds = parser().feed(b"NOP\r\nSUB T ch\r\n\r\n")
    assert [(c.name, c.params) for c in cmds] == [
        (b"NOP", []),
        (b"SUB", [b"T", b"ch"]),
        (b"", []),
    ]


def test_only_one_trailing_cr_is_stripped() -> None:
    assert parser().feed(b"NOP\r\r\n")[0].name == b"NOP\r"


def test_cr_elsewhere_is_kept() -> None:
    cmds = parser().feed(b"SUB T\r ch\n")
    assert cmds[0].params == [b"T\r", b"ch"]


def test_lone_cr_is_not_a_line_end() -> None:
    p = parser()
    assert p.feed(b"NOP\r") == []
    assert shape(p.feed(b"\n")) == [(b"NOP", [], None, None)]


def test_names_are_case_sensitive_and_lowercase_pub_has_no_body() -> None:
    # "pub" is an unknown command, so the bytes after it are the next line, not a body
    cmds = parser().feed(b"pub T\nNOP\n")
    assert [(c.name, c.params, c.body) for c in cmds] == [
        (b"pub", [b"T"], None),
        (b"NOP", [], None),
    ]


def test_partial_line_waits_for_newline() -> None:
    p = parser()
    assert p.feed(b"SUB T") == []
    assert p.feed(b" ch") == []
    assert shape(p.feed(b"\nRDY 1")) == [(b"SUB", [b"T", b"ch"], None, None)]
    assert shape(p.feed(b"0\n")) == [(b"RDY", [b"10"], None, None)]


def test_many_commands_in_one_chunk() -> None:
    data = b"".join(
        [
            commands.sub("T", "ch"),
            commands.rdy(5),
            commands.fin(b"0123456789abcdef"),
            commands.pub("T", b"hi"),
            commands.nop(),
        ]
    )
    cmds = parser().feed(data)
    assert [c.name for c in cmds] == [b"SUB", b"RDY", b"FIN", b"PUB", b"NOP"]
    assert cmds[3].body == b"hi"


def test_arbitrary_bytes_in_params_are_kept() -> None:
    cmds = parser().feed(b"SUB \xff\x00 ch\t\n")
    assert cmds[0].params == [b"\xff\x00", b"ch\t"]


# --------------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    "data,name,params,body",
    [
        (commands.pub("T", b"test body"), b"PUB", [b"T"], b"test body"),
        (commands.dpub("T", 1000, b"x" * 5), b"DPUB", [b"T", b"1000"], b"x" * 5),
        (commands.identify({"a": 1}), b"IDENTIFY", [], b'{"a":1}'),
        (commands.auth(b"secret"), b"AUTH", [], b"secret"),
        (
            commands.mpub("T", [b"a", b"bc"]),
            b"MPUB",
            [b"T"],
            commands.mpub_body([b"a", b"bc"]),
        ),
    ],
)
def test_body_commands(data: bytes, name: bytes, params: list[bytes], body: bytes) -> None:
    assert shape(parser().feed(data)) == [(name, params, body, None)]
    assert shape(feed_bytewise(parser(), data)) == [(name, params, body, None)]


def test_body_may_contain_newlines_and_cr() -> None:
    body = b"line1\nline2\r\n\n"
    cmds = parser().feed(commands.pub("T", body) + b"NOP\n")
    assert shape(cmds) == [(b"PUB", [b"T"], body, None), (b"NOP", [], None, None)]


def test_body_command_line_with_crlf() -> None:
    cmds = parser().feed(b"PUB T\r\n\x00\x00\x00\x02hi")
    assert shape(cmds) == [(b"PUB", [b"T"], b"hi", None)]


def test_body_command_without_params_still_reads_a_body() -> None:
    # the handler reports "PUB insufficient number of parameters"; the parser only frames
    cmds = parser().feed(b"PUB\n\x00\x00\x00\x01x")
    assert shape(cmds) == [(b"PUB", [], b"x", None)]


def test_body_split_across_feeds() -> None:
    p = parser()
    data = commands.pub("T", b"0123456789")
    assert p.feed(data[:6]) == []  # line only
    assert p.feed(data[6:8]) == []  # half the size
    assert p.feed(data[8:12]) == []  # size and part of the body
    assert shape(p.feed(data[12:])) == [(b"PUB", [b"T"], b"0123456789", None)]


def test_body_exactly_at_the_limits() -> None:
    p = parser()
    assert p.feed(commands.pub("T", b"x" * MAX_MSG))[0].body == b"x" * MAX_MSG
    assert p.feed(commands.dpub("T", 1, b"x" * MAX_MSG))[0].body == b"x" * MAX_MSG
    body = b"{" + b" " * (MAX_BODY - 2) + b"}"
    assert p.feed(b"IDENTIFY\n" + len(body).to_bytes(4, "big") + body)[0].body == body
    assert p.feed(commands.auth(b"s" * MAX_BODY))[0].body == b"s" * MAX_BODY


@pytest.mark.parametrize(
    "line,size",
    [
        (b"PUB T", MAX_MSG + 1),
        (b"DPUB T 10", MAX_MSG + 1),
        (b"MPUB T", MAX_BODY + 1),
        (b"IDENTIFY", MAX_BODY + 1),
        (b"AUTH", MAX_BODY + 1),
        (b"PUB T", 0),
        (b"MPUB T", 0),
        (b"IDENTIFY", 0),
        (b"AUTH", 0),
        (b"PUB T", -1),
        (b"PUB T", -(2**31)),
        (b"PUB T", 2**31 - 1),
    ],
)
def test_bad_body_size_is_reported_without_reading_a_body(line: bytes, size: int) -> None:
    data = line + b"\n" + size.to_bytes(4, "big", signed=True) + b"NOP\n"
    cmds = parser().feed(data)
    assert len(cmds) == 1
    cmd = cmds[0]
    assert cmd.name == line.split(b" ")[0]
    assert cmd.params == line.split(b" ")[1:]
    assert cmd.body is None
    assert cmd.bad_body_size == size


def test_mpub_uses_body_limit_and_pub_uses_message_limit() -> None:
    size = MAX_MSG + 1  # > max message, <= max body
    mpub_data = b"MPUB T\n" + size.to_bytes(4, "big") + b"\x00" * size
    assert parser().feed(mpub_data)[0].bad_body_size is None
    pub_data = b"PUB T\n" + size.to_bytes(4, "big") + b"\x00" * size
    assert parser().feed(pub_data)[0].bad_body_size == size


def test_set_limits() -> None:
    p = parser()
    p.set_limits(max_msg_size=5, max_body_size=10)
    assert p.feed(commands.pub("T", b"123456"))[0].bad_body_size == 6
    q = parser()
    q.set_limits(max_msg_size=5, max_body_size=10)
    assert q.feed(commands.auth(b"x" * 11))[0].bad_body_size == 11
    r = parser()
    r.set_limits(max_msg_size=500, max_body_size=5000)
    assert r.feed(commands.pub("T", b"x" * 500))[0].body == b"x" * 500


def test_bad_size_split_across_feeds() -> None:
    p = parser()
    assert p.feed(b"PUB T\n\x00\x00") == []
    cmds = p.feed(b"\x00\x00")
    assert shape(cmds) == [(b"PUB", [b"T"], None, 0)]


# --------------------------------------------------------------------------- long lines


def test_max_line_length_matches_go_read_buffer() -> None:
    assert MAX_LINE_LENGTH == 16 * 1024


def test_longest_line_that_fits_go_buffer() -> None:
    # Go reads lines with bufio.ReadSlice on a 16 KiB reader: line + "\n" must fit in it
    line = b"A" * (MAX_LINE_LENGTH - 1)
    cmds = parser().feed(line + b"\n")
    assert [c.name for c in cmds] == [line]


def test_line_filling_the_buffer_without_newline_is_too_long() -> None:
    with pytest.raises(LineTooLong):
        parser().feed(b"A" * MAX_LINE_LENGTH)


def test_line_one_byte_too_long_with_newline() -> None:
    with pytest.raises(LineTooLong):
        parser().feed(b"A" * MAX_LINE_LENGTH + b"\n")


def test_long_line_arriving_in_pieces() -> None:
    p = parser()
    for _ in range(15):
        assert p.feed(b"A" * 1024) == []
    with pytest.raises(LineTooLong):
        p.feed(b"A" * 1024)


def test_long_line_carries_the_commands_before_it() -> None:
    # Go executes the complete commands before failing to read the long line
    p = parser()
    with pytest.raises(LineTooLong) as info:
        p.feed(commands.pub("T", b"hi") + b"NOP\n" + b"B" * (MAX_LINE_LENGTH + 10))
    assert shape(info.value.commands) == [
        (b"PUB", [b"T"], b"hi", None),
        (b"NOP", [], None, None),
    ]


def test_long_line_alone_carries_no_commands() -> None:
    with pytest.raises(LineTooLong) as info:
        parser().feed(b"B" * MAX_LINE_LENGTH)
    assert info.value.commands == []


def test_long_body_is_not_a_long_line() -> None:
    big = CommandParser(max_msg_size=1 << 20, max_body_size=1 << 20)
    body = b"x" * (3 * MAX_LINE_LENGTH)
    assert big.feed(commands.pub("T", body))[0].body == body


# --------------------------------------------------------------------------- repr


def test_command_repr_mentions_the_parts() -> None:
    text = repr(Command(b"PUB", [b"T"], b"abc"))
    assert "PUB" in text and "3" in text
