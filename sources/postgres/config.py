"""The ``type: postgres`` source's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from cdc.api import ConfigPath, SourceConfig, servers


class PostgresConfig(SourceConfig):
    type: Literal["postgres"] = "postgres"
    dsn: SecretStr = Field(description="libpq URI or key=value string; the role needs REPLICATION")
    slot: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$",
                             description="logical replication slot (default: cdc_<name>)")
    publication: str | None = Field(default=None, description="publication (default: cdc_<name>)")
    tables: list[str] = Field(default_factory=lambda: ["public.*"],
                              description="schema.table globs; 'schema.*' also captures tables created later")
    manage_publication: bool = Field(default=True, description="create the publication / add tables to it")
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict, description="event key for tables without a primary key: {schema.table: [cols]}")
    snapshot_workers: int = Field(default=1, ge=1, le=32, description=(
        "parallel snapshot readers. One is usually fastest: the server prints the rows' JSON and this "
        "process, the bottleneck, takes them from one reader with the least contention (bench/pg_snapshot.py); "
        "more help where reading the table is slow (cold disks, very wide rows)"))
    snapshot_chunk_pages: int = Field(default=2048, ge=1, description="heap pages per snapshot chunk (8 kB each)")
    heartbeat_interval: float = Field(default=10.0, gt=0, description="seconds of quiet before a heartbeat")
    status_interval: float = Field(default=10.0, gt=0, description="seconds between standby status updates")
    server_timeout: float = Field(default=30.0, gt=0, description=(
        "seconds without an answer from the server (a streamed message, a reply to a keepalive request, "
        "a heartbeat's result) before its connection counts as hung and the source reconnects; also the "
        "connect timeout unless the DSN sets connect_timeout"))
    memory_budget_mb: int = Field(default=64, ge=1,
                                  description="in-progress (streamed) transactions kept in memory before spilling to disk")
    state_dir: ConfigPath = Field(default=Path("./cdc-state"), validate_default=True,  # resolved too
                                  description="local state: unchanged-TOAST values, spilled transactions; "
                                              "relative to the config file's directory")
    protocol_version: int | None = Field(default=None, ge=1, le=4,
                                         description="pgoutput protocol (default: the newest the server has)")

    @field_validator("dsn")
    @classmethod
    def _libpq_dsn(cls, value: SecretStr) -> SecretStr:
        # Checked here too, so `cdc validate` names the option with the file's line; the message
        # names the option, never the DSN (it may hold the password).
        problem = servers.postgres.dsn_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return value

    @property
    def slot_name(self) -> str:
        return self.slot or f"cdc_{self.name.lower().replace('-', '_').replace('.', '_')}"

    @property
    def publication_name(self) -> str:
        return self.publication or f"cdc_{self.name.lower().replace('-', '_').replace('.', '_')}"
