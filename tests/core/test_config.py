"""Tests for proxy.config: defaults, the shipped config.toml, validation, overrides, presets."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path

import pytest

from proxy.config import (
    BOARD_PRESETS,
    BoardConfig,
    Config,
    ConfigError,
    UpstreamConfig,
    load_config,
    parse_listen,
)

SHIPPED = Path(__file__).resolve().parents[2] / "config.toml"
# section name -> field names, from the dataclasses themselves
FIELDS = {
    f.name: {g.name for g in dataclasses.fields(getattr(Config(), f.name))}
    for f in dataclasses.fields(Config)
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str) -> Config:
    return load_config(write(tmp_path, text))


class TestDefaults:
    def test_none_path_gives_defaults(self) -> None:
        """load_config(None) returns the built-in defaults."""
        assert load_config(None) == Config()

    def test_default_values(self) -> None:
        """The built-in defaults match the documented values (loopback, 32 MiB, ...)."""
        cfg = Config()
        assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8081)
        assert cfg.server.max_body_bytes == 32 * 1024 * 1024
        assert cfg.server.shutdown_drain_s == 30.0
        assert cfg.admin.auth_token is None
        assert cfg.upstream == UpstreamConfig(
            url="http://127.0.0.1:8080",
            connect_timeout_s=5.0,
            header_timeout_s=0.0,
            idle_timeout_s=300.0,
            keepalive_timeout_s=4.0,
            max_connections=16,
            max_event_bytes=8 * 1024 * 1024,
        )
        assert cfg.client.write_timeout_s == 60.0
        assert (cfg.client.read_timeout_s, cfg.client.max_header_bytes) == (30.0, 65536)
        assert (cfg.log.file, cfg.log.level) == (None, "info")
        assert (cfg.stats.recent, cfg.stats.window) == (100, 10000)
        assert cfg.accounting.enabled is True
        assert (cfg.accounting.lookup_timeout_s, cfg.accounting.cache_entries) == (10.0, 1024)
        assert cfg.board == BoardConfig(None, 0.0, 0.0)

    def test_frozen(self) -> None:
        """Config objects are immutable."""
        with pytest.raises(dataclasses.FrozenInstanceError):
            Config().server.port = 1  # type: ignore[misc]

    def test_empty_file_gives_defaults(self, tmp_path: Path) -> None:
        """An empty file changes nothing."""
        assert load_text(tmp_path, "") == Config()


class TestShippedFile:
    def test_equals_defaults(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The shipped config.toml loads and equals the built-in defaults."""
        monkeypatch.chdir(SHIPPED.parent)
        assert load_config("config.toml") == Config()

    def test_has_every_field(self) -> None:
        """The shipped file sets every section and every field, and nothing else."""
        data = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
        assert {name: set(table) for name, table in data.items()} == FIELDS

    def test_every_key_has_a_comment(self) -> None:
        """Each key line in the shipped file is directly preceded by a comment line."""
        lines = SHIPPED.read_text(encoding="utf-8").splitlines()
        keys = 0
        for i, line in enumerate(lines):
            if re.match(r"^\w+\s*=", line):
                keys += 1
                assert lines[i - 1].startswith("# "), f"no comment above {line!r}"
        assert keys == sum(len(names) for names in FIELDS.values())

    def test_header_and_preset_names(self) -> None:
        """The file states the precedence rule and lists every board preset name."""
        text = SHIPPED.read_text(encoding="utf-8")
        assert "Flags override this file; this file overrides built-in defaults." in text
        for name in BOARD_PRESETS:
            assert name in text


class TestUnknownKeys:
    def test_unknown_key(self, tmp_path: Path) -> None:
        """An unknown key is an error naming the section and key."""
        with pytest.raises(ConfigError, match=r"unknown key \[upstream\] idel_timeout_s"):
            load_text(tmp_path, "[upstream]\nidel_timeout_s = 3\n")

    def test_unknown_section(self, tmp_path: Path) -> None:
        """An unknown section is an error naming the section."""
        with pytest.raises(ConfigError, match=r"config\.toml: unknown section \[serv\]"):
            load_text(tmp_path, "[serv]\nport = 1\n")

    def test_top_level_key(self, tmp_path: Path) -> None:
        """A key outside any section is reported as an unknown section."""
        with pytest.raises(ConfigError, match=r"unknown section \[port\]"):
            load_text(tmp_path, "port = 1\n")

    def test_section_not_a_table(self) -> None:
        """A section given as a scalar is an error naming the section."""
        with pytest.raises(ConfigError, match=r"\[server\] must be a table"):
            load_config(None, {"server": 5})  # type: ignore[dict-item]

    def test_unknown_override_key(self) -> None:
        """An unknown key in the overrides is an error naming the key."""
        with pytest.raises(ConfigError, match=r"overrides: unknown key \[log\] path"):
            load_config(None, {"log": {"path": "x"}})


class TestTypes:
    def test_string_for_float_message(self, tmp_path: Path) -> None:
        """A string for a float is an error with the file, full key, rule and value."""
        with pytest.raises(ConfigError) as info:
            load_text(tmp_path, '[upstream]\nidle_timeout_s = "abc"\n')
        msg = str(info.value)
        assert msg.endswith("[upstream] idle_timeout_s: must be a number >= 0, got 'abc'")
        assert "config.toml" in msg

    def test_bool_for_int(self, tmp_path: Path) -> None:
        """A bool is not accepted where an int is expected."""
        with pytest.raises(ConfigError, match=r"\[server\] port: must be an integer"):
            load_text(tmp_path, "[server]\nport = true\n")

    def test_float_for_int(self, tmp_path: Path) -> None:
        """A float is not accepted where an int is expected."""
        with pytest.raises(ConfigError, match=r"\[stats\] window: must be an integer >= 1"):
            load_text(tmp_path, "[stats]\nwindow = 10.0\n")

    def test_int_for_bool(self, tmp_path: Path) -> None:
        """An int is not accepted where a bool is expected."""
        with pytest.raises(ConfigError, match=r"\[accounting\] enabled: must be true or false"):
            load_text(tmp_path, "[accounting]\nenabled = 1\n")

    def test_bool_for_float(self, tmp_path: Path) -> None:
        """A bool is not accepted where a float is expected."""
        with pytest.raises(ConfigError, match=r"\[client\] write_timeout_s"):
            load_text(tmp_path, "[client]\nwrite_timeout_s = false\n")

    def test_int_for_float_is_converted(self, tmp_path: Path) -> None:
        """An int is accepted for a float field and stored as a float."""
        value = load_text(tmp_path, "[client]\nwrite_timeout_s = 7\n").client.write_timeout_s
        assert value == 7.0 and isinstance(value, float)

    def test_number_for_string(self, tmp_path: Path) -> None:
        """A number is not accepted where a string is expected."""
        with pytest.raises(ConfigError, match=r"\[server\] host: must be a string, got 1"):
            load_text(tmp_path, "[server]\nhost = 1\n")

    def test_negative_where_min_zero(self, tmp_path: Path) -> None:
        """A negative value for a field with minimum 0 is rejected."""
        with pytest.raises(ConfigError, match=r"\[stats\] recent: must be an integer >= 0, got -1"):
            load_text(tmp_path, "[stats]\nrecent = -1\n")

    def test_zero_where_positive_required(self, tmp_path: Path) -> None:
        """Zero is rejected for a field that must be > 0."""
        with pytest.raises(ConfigError, match=r"keepalive_timeout_s: must be a number > 0, got 0"):
            load_text(tmp_path, "[upstream]\nkeepalive_timeout_s = 0\n")

    def test_zero_turns_timeout_off(self, tmp_path: Path) -> None:
        """Zero is accepted for timeouts where 0 means off."""
        cfg = load_text(tmp_path, "[upstream]\nidle_timeout_s = 0\n[client]\nwrite_timeout_s = 0\n")
        assert cfg.upstream.idle_timeout_s == 0.0 and cfg.client.write_timeout_s == 0.0

    @pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
    def test_non_finite_float(self, tmp_path: Path, value: str) -> None:
        """NaN and infinities are rejected for float fields."""
        with pytest.raises(ConfigError, match=r"shutdown_drain_s"):
            load_text(tmp_path, f"[server]\nshutdown_drain_s = {value}\n")

    def test_port_range(self, tmp_path: Path) -> None:
        """A port above 65535 is rejected."""
        with pytest.raises(ConfigError, match=r"port: must be an integer >= 0 and <= 65535"):
            load_text(tmp_path, "[server]\nport = 65536\n")

    def test_max_connections_min(self, tmp_path: Path) -> None:
        """max_connections must be at least 1."""
        with pytest.raises(ConfigError, match=r"\[upstream\] max_connections"):
            load_text(tmp_path, "[upstream]\nmax_connections = 0\n")

    def test_log_level_choices(self, tmp_path: Path) -> None:
        """An unknown log level is rejected, listing the valid levels."""
        with pytest.raises(ConfigError, match=r"one of debug, info, warning, error, got 'verbose'"):
            load_text(tmp_path, '[log]\nlevel = "verbose"\n')

    def test_empty_host(self, tmp_path: Path) -> None:
        """An empty listen host is rejected."""
        with pytest.raises(ConfigError, match=r"\[server\] host: must not be empty"):
            load_text(tmp_path, '[server]\nhost = ""\n')

    def test_optional_strings(self, tmp_path: Path) -> None:
        """Optional strings are None when empty and kept as given otherwise."""
        cfg = load_text(tmp_path, '[admin]\nauth_token = "s3cret"\n[log]\nfile = ""\n')
        assert cfg.admin.auth_token == "s3cret" and cfg.log.file is None


class TestUpstreamUrl:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
            ("https://llm.example.com", "https://llm.example.com"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            ("http://host:9000/prefix/", "http://host:9000/prefix"),
        ],
    )
    def test_valid_and_normalised(self, tmp_path: Path, url: str, expected: str) -> None:
        """Valid http(s) URLs are accepted and stored without a trailing slash."""
        assert load_text(tmp_path, f'[upstream]\nurl = "{url}"\n').upstream.url == expected

    @pytest.mark.parametrize(
        "url",
        [
            "ftp://host:21",
            "127.0.0.1:8080",
            "http://",
            "http://:8080",
            "http://host:8080/?x=1",
            "http://host:8080/#frag",
            "http://host:99999",
            "http://host:port",
            "http://ho st",
            "http://[::1",
            "",
        ],
    )
    def test_invalid(self, tmp_path: Path, url: str) -> None:
        """URLs without an http(s) scheme or host, or with a query/fragment/bad port, fail."""
        with pytest.raises(ConfigError, match=r"config\.toml: \[upstream\] url: "):
            load_text(tmp_path, f'[upstream]\nurl = "{url}"\n')


class TestOverrides:
    def test_overrides_win_over_file(self, tmp_path: Path) -> None:
        """Override values replace file values; other file values are kept."""
        path = write(tmp_path, '[server]\nhost = "10.0.0.1"\nport = 9001\n[log]\nlevel = "debug"\n')
        cfg = load_config(path, {"server": {"port": 9000}, "upstream": {"url": "http://h:1/"}})
        assert (cfg.server.host, cfg.server.port) == ("10.0.0.1", 9000)
        assert cfg.upstream.url == "http://h:1"
        assert cfg.log.level == "debug"

    def test_file_wins_over_defaults(self, tmp_path: Path) -> None:
        """File values replace defaults; keys absent from the file keep their defaults."""
        cfg = load_text(tmp_path, "[server]\nport = 9001\n")
        assert cfg.server == dataclasses.replace(Config().server, port=9001)

    def test_overrides_without_file(self) -> None:
        """Overrides apply on top of the defaults when no file is given."""
        cfg = load_config(None, {"server": {"host": "0.0.0.0"}, "log": {"file": "x.jsonl"}})
        assert cfg.server.host == "0.0.0.0" and cfg.log.file == "x.jsonl"

    def test_none_override_is_ignored(self, tmp_path: Path) -> None:
        """A None override value means "flag not given" and keeps the file's value."""
        cfg = load_config(write(tmp_path, "[server]\nport = 9001\n"), {"server": {"port": None}})
        assert cfg.server.port == 9001

    def test_overrides_are_validated(self) -> None:
        """Bad override values are rejected like file values, naming the key."""
        with pytest.raises(ConfigError, match=r"overrides: \[server\] port: must be an integer"):
            load_config(None, {"server": {"port": "80"}})


class TestFileErrors:
    def test_missing_file(self, tmp_path: Path) -> None:
        """An explicit path that does not exist is an error naming the path."""
        path = tmp_path / "nope.toml"
        with pytest.raises(ConfigError, match=r"nope\.toml: config file not found"):
            load_config(path)

    def test_directory(self, tmp_path: Path) -> None:
        """A path that cannot be read as a file is a ConfigError."""
        with pytest.raises(ConfigError, match=r"cannot read config file"):
            load_config(tmp_path)

    def test_syntax_error(self, tmp_path: Path) -> None:
        """A TOML syntax error is a ConfigError with the file name and tomllib's message."""
        with pytest.raises(ConfigError, match=r"config\.toml: invalid TOML: .*line 2"):
            load_text(tmp_path, "[server]\nport = = 1\n")

    def test_not_utf8(self, tmp_path: Path) -> None:
        """A file that is not UTF-8 is a ConfigError."""
        path = tmp_path / "config.toml"
        path.write_bytes(b'[log]\nfile = "\xff"\n')
        with pytest.raises(ConfigError, match=r"config\.toml: "):
            load_config(path)


class TestPresets:
    def test_preset_fills_values(self, tmp_path: Path) -> None:
        """A preset fills bandwidth and peak compute that are left at 0."""
        board = load_text(tmp_path, '[board]\npreset = "jetson-orin-nano-8gb"\n').board
        assert board.preset == "jetson-orin-nano-8gb"
        assert (board.memory_bandwidth_gbs, board.peak_tflops) == BOARD_PRESETS[board.preset]
        assert board.memory_bandwidth_gbs == 68.0

    def test_explicit_values_win(self, tmp_path: Path) -> None:
        """Explicit non-zero values are kept even when a preset is set."""
        text = '[board]\npreset = "jetson-agx-orin-64gb"\nmemory_bandwidth_gbs = 150\n'
        board = load_text(tmp_path, text).board
        assert board.memory_bandwidth_gbs == 150.0
        assert board.peak_tflops == BOARD_PRESETS["jetson-agx-orin-64gb"][1]

    def test_override_preset_replaces_file_preset(self, tmp_path: Path) -> None:
        """A preset given as an override fills values from that preset, not the file's."""
        path = write(tmp_path, '[board]\npreset = "raspberry-pi-5"\n')
        board = load_config(path, {"board": {"preset": "rk3588"}}).board
        assert board.memory_bandwidth_gbs == BOARD_PRESETS["rk3588"][0]

    def test_unknown_preset(self, tmp_path: Path) -> None:
        """An unknown preset is an error listing the valid preset names."""
        with pytest.raises(ConfigError) as info:
            load_text(tmp_path, '[board]\npreset = "jetson-nano"\n')
        assert "[board] preset" in str(info.value)
        for name in BOARD_PRESETS:
            assert name in str(info.value)

    def test_required_presets_and_values(self) -> None:
        """The documented presets exist with the vendor memory bandwidth figures."""
        bandwidth = {name: bw for name, (bw, _) in BOARD_PRESETS.items()}
        assert bandwidth["jetson-orin-nano-8gb"] == 68.0
        assert bandwidth["jetson-orin-nano-4gb"] == 34.0
        assert bandwidth["jetson-orin-nx-16gb"] == bandwidth["jetson-orin-nx-8gb"] == 102.4
        assert bandwidth["jetson-agx-orin-64gb"] == bandwidth["jetson-agx-orin-32gb"] == 204.8
        assert math.isclose(bandwidth["raspberry-pi-5"], 17.068)
        assert 30 < bandwidth["rk3588"] < 40
        assert math.isclose(BOARD_PRESETS["jetson-agx-orin-64gb"][1], 42.5984)
        assert all(bw > 0 and tf >= 0 for bw, tf in BOARD_PRESETS.values())


class TestParseListen:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            ("127.0.0.1:8081", ("127.0.0.1", 8081)),
            ("0.0.0.0:80", ("0.0.0.0", 80)),
            ("localhost:65535", ("localhost", 65535)),
            ("[::1]:8081", ("::1", 8081)),
            ("[::]:0", ("::", 0)),
        ],
    )
    def test_valid(self, value: str, expected: tuple[str, int]) -> None:
        """HOST:PORT and [IPV6]:PORT are split into host and integer port."""
        assert parse_listen(value) == expected

    @pytest.mark.parametrize(
        "value",
        [
            "8081",
            ":8081",
            "host:",
            "host:abc",
            "host:65536",
            "host:-1",
            "::1:8081",
            "[::1]",
            "[]:80",
            "ho st:80",
            "host:８０",
        ],
    )
    def test_invalid(self, value: str) -> None:
        """Missing host or port, a bad port, or unbracketed IPv6 raise ConfigError."""
        with pytest.raises(ConfigError, match="invalid listen address"):
            parse_listen(value)
