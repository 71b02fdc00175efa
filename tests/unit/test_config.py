"""Config files: typed models, every problem at once with file:line, ${VAR}, X_file secrets, the CLI."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import SecretStr

from cdc import plugins
from cdc.api import Sink, SinkConfig, Source, SourceConfig
from cdc.cli import main
from cdc.config import AppConfig, load_config
from cdc.config.interpolate import interpolate
from cdc.errors import ConfigError
from cdc.log.base import TopicSettings
from sources.generator import GeneratorConfig


class VaultConfig(SourceConfig):
    """A test-only plugin config with secrets."""

    type: Literal["vault"] = "vault"
    dsn: str
    password: SecretStr
    token: SecretStr | None = None


class VaultSource(Source):
    config_model = VaultConfig
    connector = "vault"

    def start(self) -> None: ...
    def poll(self, timeout: float) -> None: ...
    def commit(self, position: Any) -> None: ...
    def stop(self) -> None: ...


class MemoryConfig(SinkConfig):
    type: Literal["memory"] = "memory"


class MemorySink(Sink):
    config_model = MemoryConfig

    def start(self) -> None: ...
    def write(self, records: list[Any]) -> None: ...
    def stop(self) -> None: ...


@dataclass
class _EntryPoint:
    name: str
    value: str
    group: str
    cls: Any
    dist: Any = None

    def load(self) -> Any:
        return self.cls


@pytest.fixture(autouse=True)
def with_vault_plugin(monkeypatch):
    """The installed plugins plus the test-only ``vault`` source and ``memory`` sink."""
    fakes = [_EntryPoint("vault", "tests:VaultSource", "cdc.sources", VaultSource),
             _EntryPoint("memory", "tests:MemorySink", "cdc.sinks", MemorySink)]

    def fake_entry_points(group: str):
        return [*entry_points(group=group), *(f for f in fakes if f.group == group)]

    plugins.clear_cache()
    monkeypatch.setattr(plugins, "entry_points", fake_entry_points)
    yield
    plugins.clear_cache()


def write(tmp_path: Path, text: str, name: str = "cdc.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def problems_of(path: Path, env: dict[str, str] | None = None) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env=env or {})
    assert all(p.file == str(path) for p in caught.value.problems)
    return [(p.line, p.path, p.message) for p in caught.value.problems]


def test_a_valid_file_loads_into_typed_models(tmp_path, monkeypatch):
    monkeypatch.chdir("/")  # paths resolve against the file's directory, not the working one
    path = write(tmp_path, """
        sources:
          - name: gen
            type: generator
            keys: 50
            schema: shop
            tables: ["shop.*"]
            snapshot: never
        """)
    config = load_config(path, env={})
    assert isinstance(config, AppConfig)
    [gen] = config.sources
    assert isinstance(gen, GeneratorConfig)
    assert (gen.name, gen.keys, gen.schema_name, gen.tables, gen.snapshot) == ("gen", 50, "shop", ["shop.*"], "never")
    assert gen.events is None and gen.transaction_size == 10  # the plugin's defaults
    assert config.sinks == []
    # No log section: the embedded log with its defaults, next to the config file.
    assert config.log.kind == "embedded" and config.log.kafka is None
    assert config.log.embedded.path == tmp_path.resolve() / "cdc-data"
    assert config.log.topic_prefix == "cdc" and config.log.embedded.fsync is True
    assert config.log.topic_settings() == TopicSettings(partitions=1, delete_retention_ms=86_400_000)
    assert config.http == "127.0.0.1:8083" and config.http_address() == ("127.0.0.1", 8083)
    assert config.source("gen") is gen
    assert config.model_dump()["sources"][0]["keys"] == 50  # the plugin's fields survive a dump


def test_embedded_path_is_relative_to_the_file_and_kafka_gives_topic_settings(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    (tmp_path / "conf").mkdir()
    embedded = load_config(write(tmp_path, """
        log:
          embedded: {path: ../data, topic_prefix: shop, partitions: 4, fsync: false}
        http: null
        """, "conf/a.yaml"), env={})
    assert embedded.log.embedded.path == tmp_path.resolve() / "data"
    assert embedded.log.topic_settings().partitions == 4 and embedded.log.embedded.fsync is False
    assert embedded.http is None and embedded.http_address() is None

    kafka = load_config(write(tmp_path, """
        log:
          kafka:
            bootstrap_servers: "127.0.0.1:9092"
            topic_prefix: shop
            partitions: 3
            replication_factor: 2
            topic_config: {segment.ms: 3600000}
            producer: {linger.ms: 5, enable.idempotence: true}
        """), env={})
    assert kafka.log.kind == "kafka" and kafka.log.embedded is None
    assert kafka.log.kafka.producer == {"linger.ms": 5, "enable.idempotence": True}
    assert kafka.log.topic_settings() == TopicSettings(
        partitions=3, replication_factor=2, min_compaction_lag_ms=0, delete_retention_ms=86_400_000,
        extra={"segment.ms": "3600000"})


def test_topics_are_replicated_as_the_cluster_says_unless_the_config_says_otherwise(tmp_path):
    unset = load_config(write(tmp_path, """
        log:
          kafka: {bootstrap_servers: "127.0.0.1:9092"}
        """), env={}).log.topic_settings()
    assert (unset.replication_factor, unset.min_insync_replicas) == (None, None)
    chosen = load_config(write(tmp_path, """
        log:
          kafka: {bootstrap_servers: "127.0.0.1:9092", replication_factor: 3, min_insync_replicas: 2}
        """), env={}).log.topic_settings()
    assert (chosen.replication_factor, chosen.min_insync_replicas) == (3, 2)
    with pytest.raises(ConfigError, match=r"min_insync_replicas \(3\) above replication_factor \(2\)"):
        load_config(write(tmp_path, """
            log:
              kafka: {bootstrap_servers: "127.0.0.1:9092", replication_factor: 2, min_insync_replicas: 3}
            """), env={})


def test_every_problem_is_reported_at_once_with_its_line_and_path(tmp_path):
    path = write(tmp_path, """
        log:
          kafka: {topic_prefix: shop}
        color: blue
        sources:
          - name: gen
            type: generator
            keys: many
            kyes: 3
          - name: other
            type: oracle
          - name: gen
            type: generator
            database: ${SHOP_DB}
        sinks:
          - {type: generator}
          - {name: other, type: memory, topics: ["shop.*"]}
        http: "localhost:99999"
        """)
    assert problems_of(path) == [
        (2, "log.kafka.bootstrap_servers", "required field is missing"),
        (3, "color", "unknown key 'color'"),
        (7, "sources[0].keys", "Input should be a valid integer, unable to parse string as an integer"),
        (8, "sources[0].kyes", "unknown key 'kyes'; did you mean 'keys'?"),
        (10, "sources[1].type", f"unknown source type 'oracle'; installed: {installed_sources('vault')}"),
        (11, "sources[2].name", "duplicate name 'gen': sources[0] has it too; names must be unique "
                                "across sources and sinks"),
        (13, "sources[2].database", "environment variable SHOP_DB is not set "
                                    "(give a default with ${SHOP_DB:-value})"),
        (15, "sinks[0].type", f"unknown sink type 'generator'; installed: {installed_sinks('memory')}"),
        (16, "sinks[1].name", "duplicate name 'other': sources[1] has it too; names must be unique "
                              "across sources and sinks"),
        (17, "http", "port must be a number from 0 to 65535, got '99999'"),
    ]


def test_a_missing_required_field_points_at_the_mapping_that_lacks_it(tmp_path):
    path = write(tmp_path, """
        sources:
          - name: ok
            type: generator
          - type: vault
            password: x
        """)
    assert problems_of(path) == [(4, "sources[1].name", "required field is missing"),
                                 (4, "sources[1].dsn", "required field is missing")]


def test_yaml_syntax_errors_and_duplicate_keys_have_lines(tmp_path):
    assert problems_of(write(tmp_path, "sources:\n  - {name: a\nhttp: null\n"))[0][0] == 3
    dup = write(tmp_path, "http: null\nlog: {}\nhttp: '127.0.0.1:1'\n", "dup.yaml")
    assert problems_of(dup) == [(3, "http", "duplicate key 'http' (first on line 1)")]
    flow = write(tmp_path, "log:\n  embedded: {partitions: ${P}}\n", "flow.yaml")
    [(line, _, message)] = problems_of(flow)
    assert line == 2 and 'quote values that hold ${...}' in message


def test_kafka_and_embedded_together_is_an_error(tmp_path):
    path = write(tmp_path, """
        log:
          kafka: {bootstrap_servers: "127.0.0.1:9092"}
          embedded: {}
        """)
    assert problems_of(path) == [(1, "log", "give either kafka or embedded, not both")]


def test_interpolation_grammar():
    env = {"HOST": "db", "PORT": "5432", "EMPTY": ""}
    assert interpolate("postgresql://${HOST}:${PORT}/x", env) == ("postgresql://db:5432/x", [])
    assert interpolate("${MISSING:-fallback} ${EMPTY:-used} ${HOST:-unused}", env) == ("fallback used db", [])
    assert interpolate("pa$$word, $${HOST}, a$b", env) == ("pa$word, ${HOST}, a$b", [])
    assert interpolate("${MISSING:-}", env) == ("", [])
    _, errors = interpolate("${A} ${B} ${1x} ${open", env)
    assert [e.split(" ")[:3] for e in errors] == [["environment", "variable", "A"], ["environment", "variable", "B"],
                                                   ["bad", "reference", "'${1x}':"], ["unterminated", "'${'", "(write"]]


def test_interpolated_values_validate_as_their_field_types(tmp_path):
    path = write(tmp_path, """
        log:
          embedded:
            path: ${DATA:-./d}
            partitions: ${PARTS:-3}
            fsync: ${FSYNC}
        sources:
          - name: gen-${ENV_NAME}
            type: generator
            keys: ${KEYS}
            database: "$${literal}"
        """)
    config = load_config(path, env={"FSYNC": "false", "ENV_NAME": "prod", "KEYS": "12"})
    assert config.log.embedded.partitions == 3 and config.log.embedded.fsync is False
    assert config.log.embedded.path == tmp_path.resolve() / "d"
    gen = config.sources[0]
    assert (gen.name, gen.keys, gen.database) == ("gen-prod", 12, "${literal}")
    # A value from the environment that is not a number is reported as a type problem at its line.
    assert problems_of(path, {"FSYNC": "no", "ENV_NAME": "p", "KEYS": "a dozen"}) == [
        (9, "sources[0].keys", "Input should be a valid integer, unable to parse string as an integer")]


def test_secrets_come_from_files_and_are_never_shown(tmp_path):
    (tmp_path / "pw").write_text("s3cret-pw\n")
    (tmp_path / "token").write_text("tok\r\n")
    path = write(tmp_path, """
        sources:
          - name: v
            type: vault
            dsn: postgresql://cdc@db/shop
            password_file: pw
            token_file: ${SECRETS}/token
        """)
    config = load_config(path, env={"SECRETS": str(tmp_path)})
    vault = config.sources[0]
    assert isinstance(vault, VaultConfig)
    assert vault.password.get_secret_value() == "s3cret-pw"
    assert vault.token.get_secret_value() == "tok"
    assert "s3cret" not in repr(config) and "s3cret" not in str(config)
    assert "s3cret" not in json.dumps(config.model_dump(mode="json"))


def test_secret_file_problems(tmp_path):
    (tmp_path / "pw").write_text("x")
    path = write(tmp_path, """
        sources:
          - name: a
            type: vault
            dsn: d
            password_file: nowhere
          - name: b
            type: vault
            dsn: d
            password: inline
            password_file: pw
          - name: c
            type: vault
            dsn: d
            password_file: ${PW_FILE}
            dsn_typo_file: pw
        """)
    problems = problems_of(path)
    assert [(line, where) for line, where, _ in problems] == [
        (5, "sources[0].password_file"), (10, "sources[1].password_file"),
        (14, "sources[2].password_file"), (15, "sources[2].dsn_typo_file")]
    assert problems[0][2].startswith(f"cannot read secret file {tmp_path / 'nowhere'}: No such file")
    assert problems[1][2] == "give password or password_file, not both"
    assert problems[2][2].startswith("environment variable PW_FILE is not set")
    assert problems[3][2] == "unknown key 'dsn_typo_file'"


def test_cdc_validate_exit_codes_and_output(tmp_path, capsys):
    good = write(tmp_path, """
        sources:
          - {name: a, type: generator}
          - {name: b, type: generator, keys: 3}
        sinks:
          - {name: c, type: memory, topics: [cdc.public.items]}
        """, "good.yaml")
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: ok (2 sources, 1 sinks)\n"

    bad = write(tmp_path, """
        sources:
          - {name: a, type: generator, keys: 0}
        http: nonsense
        """, "bad.yaml")
    assert main(["validate", str(bad)]) == 2
    assert capsys.readouterr().out.splitlines() == [
        f"{bad}:2: sources[0].keys: Input should be greater than or equal to 1",
        f"{bad}:3: http: expected host:port, got 'nonsense'"]

    assert main(["validate", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read the file: No such file" in capsys.readouterr().out


def real_source_plugins() -> set[str]:
    from importlib.metadata import entry_points

    return {e.name for e in entry_points(group="cdc.sources")}


def installed_sinks(*extra: str) -> str:
    from importlib.metadata import entry_points

    return ", ".join(sorted({*(e.name for e in entry_points(group="cdc.sinks")), *extra}))


def installed_sources(*extra: str) -> str:
    """The "installed: ..." list as the error gives it: the project's plugins plus test fakes."""
    return ", ".join(sorted({*real_source_plugins(), *extra}))


def test_cdc_schema_describes_the_installed_plugins(capsys):
    assert main(["schema", "--indent", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # --indent 0: one line
    schema = json.loads(out)
    items = schema["properties"]["sources"]["items"]
    mapping = items["discriminator"]["mapping"]
    assert mapping["generator"] == "#/$defs/GeneratorConfig" and mapping["vault"] == "#/$defs/VaultConfig"
    assert set(mapping) == {"vault", *real_source_plugins()}
    assert {"$ref": "#/$defs/GeneratorConfig"} in items["oneOf"]
    generator = schema["$defs"]["GeneratorConfig"]
    assert generator["properties"]["keys"]["minimum"] == 1
    assert "type" in generator["required"] and generator["additionalProperties"] is False
    vault = schema["$defs"]["VaultConfig"]
    assert "password_file" in vault["properties"] and "password" not in vault["required"]
    assert {"anyOf": [{"required": ["password"]}, {"required": ["password_file"]}]} in vault["allOf"]
    assert schema["properties"]["log"] == {"$ref": "#/$defs/LogConfig"}
    assert "SourceConfig" not in schema["$defs"]  # the base model is replaced by the plugins


def test_the_log_format_and_debeziums_type_modes(tmp_path):
    from cdc.config import load_config

    path = write(tmp_path, """
        log:
          kafka: {bootstrap_servers: "127.0.0.1:9092"}
          format: debezium-json
          debezium: {decimal_handling_mode: string, time_precision_mode: connect}
        """)
    config = load_config(path)
    assert config.log.format == "debezium-json"
    options = config.log.debezium.options()
    assert (options.decimal_handling_mode, options.time_mode("mysql"), options.binary_handling_mode) == (
        "string", "connect", "bytes")
    assert load_config(write(tmp_path, "log: {embedded: {}}\n")).log.format == "json"
    avro = load_config(write(tmp_path, "log: {format: avro, schema_registry: {url: 'http://127.0.0.1:8081'}}\n"))
    assert (avro.log.format, avro.log.schema_registry.url) == ("avro", "http://127.0.0.1:8081")
    assert [where for _, where, _ in problems_of(write(tmp_path, "log: {format: avro}\n"))] == ["log"]
    bad = write(tmp_path, """
        log:
          format: protobuf
          debezium: {decimal_handling_mode: exact}
        """)
    assert [(line, where) for line, where, _ in problems_of(bad)] == [
        (2, "log.format"), (3, "log.debezium.decimal_handling_mode")]


def test_a_sink_that_reads_the_topics_itself_must_read_the_logs_format(tmp_path, monkeypatch):
    """``cdc validate`` says what ``cdc run`` would refuse: a self-driven sink (the Spark delta
    sink decodes records itself) on a log whose format it does not read. It reads avro."""
    from spark_sinks.delta import DeltaSink

    text = """
        log:
          kafka: {bootstrap_servers: "127.0.0.1:9092"}
          format: avro
          schema_registry: {url: "http://127.0.0.1:8081"}
        sinks:
          - name: lake
            type: delta
            topics: ["cdc.public.*"]
            path: ./lake
            checkpoint: ./lake-cp
        """
    assert load_config(write(tmp_path, text)).log.format == "avro"
    monkeypatch.setattr(DeltaSink, "formats", ("json", "debezium-json"))
    [(line, where, message)] = problems_of(write(tmp_path, text))
    assert (line, where) == (7, "sinks[0].type")
    assert "cannot read log.format avro: it reads json, debezium-json" in message
