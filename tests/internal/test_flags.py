"""Go-style command lines and TOML config resolution: an explicit flag wins over the config
file's key, which wins over the default; a config duration may be a string or an integer of
milliseconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from nsqpy.internal import lg
from nsqpy.internal.flags import (
    BOOL,
    DURATION,
    FLOAT,
    FLOAT_LIST,
    INT,
    LOG_LEVEL,
    STR,
    STR_LIST,
    TLS_NOT_REQUIRED,
    TLS_REQUIRED,
    TLS_REQUIRED_ALL,
    TLS_REQUIRED_EXCEPT_HTTP,
    UsageError,
    option,
    parse_argv,
    render_value,
    resolve,
    run_command,
    specs,
    usage,
)
from nsqpy.nsqd.options import Options as NsqdOptions


@dataclass
class Opts:
    version: bool = option("version", False, BOOL, "print version string")
    config: str = option("config", "", STR, "path to config file")
    log_level: int = option("log-level", lg.INFO, LOG_LEVEL, "log level")
    tcp_address: str = option("tcp-address", "0.0.0.0:4150", STR, "tcp address")
    mem_queue_size: int = option("mem-queue-size", 10000, INT, "mem queue size")
    msg_timeout: float = option("msg-timeout", 60.0, DURATION, "msg timeout")
    snappy: bool = option("snappy", True, BOOL, "snappy")
    verbose: bool = option("verbose", False, BOOL, "verbose")
    lookupd: list[str] = option(
        "lookupd-tcp-address", [], STR_LIST, "lookupd", cfg="nsqlookupd_tcp_addresses"
    )
    percentiles: list[float] = option(
        "e2e-processing-latency-percentile",
        [],
        FLOAT_LIST,
        "percentiles",
        cfg="e2e_processing_latency_percentiles",
    )
    node_id: int = option("node-id", 7, INT, "node id", cfg="id")
    tls_required: int = option("tls-required", TLS_NOT_REQUIRED, TLS_REQUIRED, "tls required")


def parse(*argv: str) -> Opts:
    opts, _ = resolve(Opts, list(argv))
    assert isinstance(opts, Opts)
    return opts


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------- spellings


@pytest.mark.parametrize(
    "argv",
    [
        ["-mem-queue-size", "5"],
        ["--mem-queue-size", "5"],
        ["-mem-queue-size=5"],
        ["--mem-queue-size=5"],
    ],
)
def test_all_go_spellings(argv: list[str]) -> None:
    assert parse(*argv).mem_queue_size == 5


def test_value_may_start_with_dash_or_contain_equals() -> None:
    assert parse("--tcp-address", "-weird").tcp_address == "-weird"
    assert parse("--tcp-address=a=b").tcp_address == "a=b"


def test_defaults() -> None:
    opts = parse()
    assert opts.mem_queue_size == 10000
    assert opts.msg_timeout == 60.0
    assert opts.snappy is True
    assert opts.lookupd == []
    assert opts.tls_required == TLS_NOT_REQUIRED


def test_list_defaults_are_not_shared() -> None:
    a, b = parse(), parse()
    a.lookupd.append("x")
    assert b.lookupd == []


def test_repeated_list_flags_append() -> None:
    opts = parse(
        "--lookupd-tcp-address=127.0.0.1:4160",
        "-lookupd-tcp-address",
        "127.0.0.1:4161",
        "--lookupd-tcp-address",
        "h:1",
    )
    assert opts.lookupd == ["127.0.0.1:4160", "127.0.0.1:4161", "h:1"]


def test_float_list_flag_accepts_commas_and_repeats() -> None:
    opts = parse(
        "--e2e-processing-latency-percentile=1.0,0.99",
        "--e2e-processing-latency-percentile",
        "0.95",
    )
    assert opts.percentiles == [1.0, 0.99, 0.95]


def test_float_list_flag_is_sorted_descending_like_go() -> None:
    opts = parse(
        "--e2e-processing-latency-percentile=0.5,0.99",
        "--e2e-processing-latency-percentile=1.0",
        "--e2e-processing-latency-percentile=0.75",
    )
    assert opts.percentiles == [1.0, 0.99, 0.75, 0.5]


def test_float_list_from_config_keeps_its_order(tmp_path: Path) -> None:
    # go-options coerces the TOML array directly; only the flag type sorts
    cfg = write_config(tmp_path, "e2e_processing_latency_percentiles = [0.5, 0.99]\n")
    assert parse(f"--config={cfg}").percentiles == [0.5, 0.99]


def test_repeated_scalar_flag_last_wins() -> None:
    assert parse("--mem-queue-size=1", "--mem-queue-size=2").mem_queue_size == 2


@pytest.mark.parametrize(
    "text,value", [("10", 10), ("0x10", 16), ("0o10", 8), ("010", 8), ("-3", -3), ("+4", 4)]
)
def test_int_flags_parse_like_go_parseint_base_0(text: str, value: int) -> None:
    assert parse(f"--mem-queue-size={text}").mem_queue_size == value


# --------------------------------------------------------------------------- bools


def test_bool_flag_without_value_is_true() -> None:
    assert parse("--verbose").verbose is True
    assert parse("-verbose").verbose is True


@pytest.mark.parametrize("text", ["false", "0", "f", "F", "FALSE", "False"])
def test_bool_flag_false_spellings(text: str) -> None:
    assert parse(f"--snappy={text}").snappy is False


@pytest.mark.parametrize("text", ["true", "1", "t", "T", "TRUE", "True"])
def test_bool_flag_true_spellings(text: str) -> None:
    assert parse("--snappy=false", f"--snappy={text}").snappy is True


def test_bool_flag_does_not_consume_the_next_word() -> None:
    # Go: "-snappy false" sets snappy and stops parsing at the positional "false"
    opts, parsed = resolve(Opts, ["--snappy", "false", "--mem-queue-size=5"])
    assert opts.snappy is True
    assert opts.mem_queue_size == 10000
    assert parsed.positional == ["false", "--mem-queue-size=5"]


def test_bad_bool_value() -> None:
    with pytest.raises(UsageError) as info:
        parse("--snappy=maybe")
    assert str(info.value) == 'invalid value "maybe" for flag -snappy: parse error'


@pytest.mark.parametrize(
    "argv,value",
    [
        (["--tls-required"], TLS_REQUIRED_ALL),
        (["--tls-required=true"], TLS_REQUIRED_ALL),
        (["--tls-required=1"], TLS_REQUIRED_ALL),
        (["--tls-required=tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
        (["-tls-required=tcp-https"], TLS_REQUIRED_EXCEPT_HTTP),
        (["--tls-required=false"], TLS_NOT_REQUIRED),
        ([], TLS_NOT_REQUIRED),
    ],
)
def test_tls_required_is_bool_style(argv: list[str], value: int) -> None:
    assert parse(*argv).tls_required == value


def test_tls_required_separate_word_is_positional() -> None:
    opts, parsed = resolve(Opts, ["--tls-required", "tcp-https"])
    assert opts.tls_required == TLS_REQUIRED_ALL
    assert parsed.positional == ["tcp-https"]


def test_tls_required_bad_value() -> None:
    with pytest.raises(UsageError):
        parse("--tls-required=sometimes")


# --------------------------------------------------------------------------- errors


def test_unknown_flag() -> None:
    with pytest.raises(UsageError) as info:
        parse("--no-such-flag=1")
    assert str(info.value) == "flag provided but not defined: -no-such-flag"


def test_unknown_single_dash_flag() -> None:
    with pytest.raises(UsageError) as info:
        parse("-x")
    assert str(info.value) == "flag provided but not defined: -x"


def test_missing_value() -> None:
    with pytest.raises(UsageError) as info:
        parse("--mem-queue-size")
    assert str(info.value) == "flag needs an argument: -mem-queue-size"


def test_bad_int_value() -> None:
    with pytest.raises(UsageError) as info:
        parse("--mem-queue-size=lots")
    assert str(info.value) == 'invalid value "lots" for flag -mem-queue-size: parse error'


def test_bad_duration_value() -> None:
    with pytest.raises(UsageError) as info:
        parse("--msg-timeout=60")
    assert str(info.value) == 'invalid value "60" for flag -msg-timeout: parse error'


def test_double_dash_ends_flags() -> None:
    opts, parsed = resolve(Opts, ["--mem-queue-size=3", "--", "--snappy=false"])
    assert opts.mem_queue_size == 3
    assert opts.snappy is True
    assert parsed.positional == ["--snappy=false"]


def test_help_flags() -> None:
    for flag in ("-h", "--help", "-help"):
        assert parse_argv(specs(Opts), [flag]).show_help


# --------------------------------------------------------------------------- durations, levels


@pytest.mark.parametrize(
    "text,seconds", [("60s", 60.0), ("250ms", 0.25), ("1h30m", 5400.0), ("150ms", 0.15)]
)
def test_duration_flags(text: str, seconds: float) -> None:
    assert parse(f"--msg-timeout={text}").msg_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text,level",
    [
        ("debug", lg.DEBUG),
        ("DEBUG", lg.DEBUG),
        ("Info", lg.INFO),
        ("warn", lg.WARN),
        ("error", lg.ERROR),
        ("fatal", lg.FATAL),
    ],
)
def test_log_level_flag(text: str, level: int) -> None:
    assert parse(f"--log-level={text}").log_level == level


def test_bad_log_level_flag() -> None:
    with pytest.raises(UsageError):
        parse("--log-level=warning")


# --------------------------------------------------------------------------- config files


def test_config_values_apply(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        'mem_queue_size = 5\nmsg_timeout = "30s"\nsnappy = false\n'
        'nsqlookupd_tcp_addresses = ["a:1", "b:2"]\nid = 12\nlog_level = "debug"\n',
    )
    opts = parse(f"--config={cfg}")
    assert opts.mem_queue_size == 5
    assert opts.msg_timeout == 30.0
    assert opts.snappy is False
    assert opts.lookupd == ["a:1", "b:2"]
    assert opts.node_id == 12
    assert opts.log_level == lg.DEBUG


def test_precedence_flag_over_config_over_default(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'mem_queue_size = 5\nmsg_timeout = "30s"\n')
    # flag given: wins over the config, in either order on the command line
    assert parse(f"--config={cfg}", "--mem-queue-size=9").mem_queue_size == 9
    assert parse("--mem-queue-size=9", f"--config={cfg}").mem_queue_size == 9
    # only the config: the config wins over the default
    assert parse(f"--config={cfg}").mem_queue_size == 5
    # neither: the default
    assert parse(f"--config={cfg}").snappy is True


def test_explicit_flag_equal_to_default_still_beats_config(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "mem_queue_size = 5\n")
    assert parse(f"--config={cfg}", "--mem-queue-size=10000").mem_queue_size == 10000


def test_config_list_flag_replaces_config_list(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'nsqlookupd_tcp_addresses = ["a:1"]\n')
    assert parse(f"--config={cfg}", "--lookupd-tcp-address=z:9").lookupd == ["z:9"]


@pytest.mark.parametrize(
    "toml,seconds",
    [
        ('msg_timeout = "60s"', 60.0),
        ('msg_timeout = "250ms"', 0.25),
        ('msg_timeout = "1h30m"', 5400.0),
        ("msg_timeout = 250", 0.25),  # integers are milliseconds
        ("msg_timeout = 60000", 60.0),
    ],
)
def test_config_durations(tmp_path: Path, toml: str, seconds: float) -> None:
    cfg = write_config(tmp_path, toml + "\n")
    assert parse(f"--config={cfg}").msg_timeout == pytest.approx(seconds)


@pytest.mark.parametrize(
    "toml,value",
    [
        ('nsqlookupd_tcp_addresses = ["a:1", "b:2"]', ["a:1", "b:2"]),
        ('nsqlookupd_tcp_addresses = "a:1,b:2"', ["a:1", "b:2"]),
        ('nsqlookupd_tcp_addresses = "a:1"', ["a:1"]),
        ("nsqlookupd_tcp_addresses = []", []),
    ],
)
def test_config_string_lists(tmp_path: Path, toml: str, value: list[str]) -> None:
    cfg = write_config(tmp_path, toml + "\n")
    assert parse(f"--config={cfg}").lookupd == value


@pytest.mark.parametrize(
    "toml,value",
    [
        ("e2e_processing_latency_percentiles = [1.0, 0.99, 0.95]", [1.0, 0.99, 0.95]),
        ('e2e_processing_latency_percentiles = "1.0,0.99"', [1.0, 0.99]),
        ("e2e_processing_latency_percentiles = [1, 0.5]", [1.0, 0.5]),
    ],
)
def test_config_float_lists(tmp_path: Path, toml: str, value: list[float]) -> None:
    cfg = write_config(tmp_path, toml + "\n")
    assert parse(f"--config={cfg}").percentiles == value


@pytest.mark.parametrize(
    "toml,value",
    [
        ("tls_required = true", TLS_REQUIRED_ALL),
        ("tls_required = false", TLS_NOT_REQUIRED),
        ('tls_required = "tcp-https"', TLS_REQUIRED_EXCEPT_HTTP),
        ('tls_required = "true"', TLS_REQUIRED_ALL),
    ],
)
def test_config_tls_required(tmp_path: Path, toml: str, value: int) -> None:
    cfg = write_config(tmp_path, toml + "\n")
    assert parse(f"--config={cfg}").tls_required == value


@pytest.mark.parametrize("toml,value", [("snappy = false", False), ('snappy = "false"', False)])
def test_config_bools_accept_bool_or_string(tmp_path: Path, toml: str, value: bool) -> None:
    cfg = write_config(tmp_path, toml + "\n")
    assert parse(f"--config={cfg}").snappy is value


def test_config_unknown_keys_are_ignored(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'no_such_option = 1\n[section]\nx = "y"\n')
    assert parse(f"--config={cfg}").mem_queue_size == 10000


def test_config_flag_names_are_not_config_keys(tmp_path: Path) -> None:
    # the config file uses cfg names ("id"), not flag names ("node-id" / "node_id")
    cfg = write_config(tmp_path, "node_id = 99\n")
    assert parse(f"--config={cfg}").node_id == 7


def test_config_bad_value(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'msg_timeout = "soon"\n')
    with pytest.raises(UsageError):
        parse(f"--config={cfg}")


def test_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        parse(f"--config={tmp_path / 'nope.cfg'}")
    assert str(info.value).startswith(f"failed to load config file {tmp_path / 'nope.cfg'} - ")


def test_config_bad_toml(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "this is = = not toml\n")
    with pytest.raises(UsageError):
        parse(f"--config={cfg}")


# --------------------------------------------------------------------------- rendering, main


def test_render_value_for_config_endpoint() -> None:
    assert render_value(DURATION, 60.0) == 60_000_000_000
    assert render_value(DURATION, 0.25) == 250_000_000
    assert render_value(LOG_LEVEL, lg.FATAL) == 5
    assert render_value(STR_LIST, []) == []


def test_usage_lists_flags_with_go_defaults() -> None:
    text = usage("nsqd", Opts)
    assert text.startswith("Usage of nsqd:\n")
    assert "  -mem-queue-size value\n" in text
    assert "(default 1m0s)" in text  # msg-timeout, Go's Duration.String()
    assert "  -snappy\n" in text  # bool flags take no value


def test_run_command_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_command("nsqd", Opts, ["--bogus"], "nsqd v1.3.0", lambda opts: 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("flag provided but not defined: -bogus\n")
    assert "Usage of nsqd:" in err


def test_run_command_version(capsys: pytest.CaptureFixture[str]) -> None:
    started: list[Opts] = []

    def start(opts: Opts) -> int:
        started.append(opts)
        return 0

    code = run_command("nsqd", Opts, ["--version"], "nsqd v1.3.0 (built w/x)", start)
    assert code == 0
    assert capsys.readouterr().out == "nsqd v1.3.0 (built w/x)\n"
    assert started == []


def test_run_command_starts_with_options() -> None:
    seen: list[Opts] = []

    def start(opts: Opts) -> int:
        seen.append(opts)
        return 3

    assert run_command("nsqd", Opts, ["--mem-queue-size=4"], "v", start) == 3
    assert seen[0].mem_queue_size == 4


# --------------------------------------------------------------------------- nsqd's table


def test_nsqd_config_names_match_the_reference() -> None:
    cfg = {s.flag: s.cfg for s in specs(NsqdOptions)}
    assert cfg["node-id"] == "id"
    assert cfg["lookupd-tcp-address"] == "nsqlookupd_tcp_addresses"
    assert cfg["auth-http-address"] == "auth_http_addresses"
    assert cfg["e2e-processing-latency-percentile"] == "e2e_processing_latency_percentiles"
    assert cfg["mem-queue-size"] == "mem_queue_size"
    assert cfg["max-output-buffer-timeout"] == "max_output_buffer_timeout"


def test_nsqd_flag_table_is_complete() -> None:
    flags = {s.flag for s in specs(NsqdOptions)}
    reference = {
        "version", "config", "log-level", "log-prefix", "verbose", "node-id", "worker-id",
        "https-address", "http-address", "tcp-address", "auth-http-address",
        "broadcast-address", "broadcast-tcp-port", "broadcast-http-port", "lookupd-tcp-address",
        "http-client-connect-timeout", "http-client-request-timeout", "data-path",
        "mem-queue-size", "max-bytes-per-file", "sync-every", "sync-timeout",
        "queue-scan-worker-pool-max", "queue-scan-selection-count", "msg-timeout",
        "max-msg-timeout", "max-msg-size", "max-req-timeout", "max-body-size",
        "max-heartbeat-interval", "max-rdy-count", "max-output-buffer-size",
        "max-output-buffer-timeout", "min-output-buffer-timeout", "output-buffer-timeout",
        "max-channel-consumers", "statsd-address", "statsd-interval", "statsd-mem-stats",
        "statsd-prefix", "statsd-udp-packet-size", "statsd-exclude-ephemeral",
        "e2e-processing-latency-percentile", "e2e-processing-latency-window-time",
        "tls-cert", "tls-key", "tls-client-auth-policy", "tls-root-ca-file", "tls-required",
        "tls-min-version", "deflate", "max-deflate-level", "snappy",
    }  # fmt: skip
    assert reference <= flags
    assert {"client-timeout", "queue-scan-interval", "queue-scan-refresh-interval"} <= flags


def test_nsqd_defaults_match_the_reference() -> None:
    opts, _ = resolve(NsqdOptions, [])
    assert opts.mem_queue_size == 10000
    assert opts.max_bytes_per_file == 104857600
    assert opts.msg_timeout == 60.0
    assert opts.max_msg_timeout == 900.0
    assert opts.max_msg_size == 1048576
    assert opts.max_body_size == 5242880
    assert opts.max_req_timeout == 3600.0
    assert opts.max_rdy_count == 2500
    assert opts.output_buffer_timeout == 0.25
    assert opts.client_timeout == 60.0
    assert opts.queue_scan_interval == 0.1
    assert opts.queue_scan_refresh_interval == 5.0
    assert opts.log_prefix == "[nsqd] "
    assert 0 <= opts.node_id < 1024


@dataclass
class UsageOpts:
    delimiter: str = option("delimiter", "\n", STR, "character to split input")
    prefix: str = option("log-prefix", "[tool] ", STR, "log message prefix")
    empty: str = option("empty", "", STR, "no default shown")
    rotate_interval: float = option("rotate-interval", 0.0, DURATION, "rotate every duration")
    sample: float = option("sample", 1.0, FLOAT, "fraction to publish")
    ratio: float = option("ratio", 0.25, FLOAT, "a ratio")
    log_level: int = option("log-level", lg.INFO, LOG_LEVEL, "log level")
    rotate_size: int = option("rotate-size", 0, INT, "rotate past `rotate-size` bytes")


def test_usage_renders_defaults_as_go_flag_does() -> None:
    """Go quotes string defaults (%q), omits zero values, prints floats and levels via %v."""
    text = usage("tool", UsageOpts)
    assert '    \tcharacter to split input (default "\\n")\n' in text  # one line, escaped
    assert '(default "[tool] ")' in text
    assert "no default shown\n" in text
    assert "rotate every duration\n" in text  # a zero duration is not shown, as in Go
    assert "fraction to publish (default 1)\n" in text
    assert "a ratio (default 0.25)\n" in text
    assert "log level (default INFO)\n" in text
    # Go's flag.UnquoteUsage: a back-quoted name in the help is the value's name
    assert "  -rotate-size rotate-size\n    \trotate past rotate-size bytes\n" in text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "failed to load config file {path} - open {path}: no such file or directory"),
        ("not toml ===\n", "failed to load config file {path} - "),
        ('mem_queue_size = "abc"\n', "failed to parse config option mem_queue_size='abc'"),
    ],
)
def test_run_command_config_file_error_is_one_fatal_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, expected: str
) -> None:
    """As Go's daemons: a bad --config file is fatal (exit 1, one FATAL line), not a usage error."""
    path = tmp_path / "nsqd.cfg"
    if content is not None:
        path.write_text(content)
    code = run_command("nsqd", Opts, [f"--config={path}"], "nsqd v1.3.0", lambda opts: 0)
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # no usage text after it
    assert err.startswith("[nsqd] ")
    assert f" FATAL: {expected.format(path=path)}" in err
