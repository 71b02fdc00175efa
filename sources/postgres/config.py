"""The ``type: postgres`` source's settings."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, SecretStr, field_validator, model_validator

from cdc.api import ConfigPath, SnapshotMode, SourceConfig, servers
from snapshot.signals import IncrementalSettings


class PostgresConfig(SourceConfig, IncrementalSettings):
    type: Literal["postgres"] = "postgres"
    dsn: SecretStr = Field(description="libpq URI or key=value string; the role needs REPLICATION")
    slot: str | None = Field(default=None, pattern=r"^[a-z0-9_]+$",
                             description="logical replication slot (default: cdc_<database>_<name>, see "
                                         "default_slot_name; a slot named by the old default cdc_<name> in "
                                         "this source's database is kept)")
    publication: str | None = Field(default=None, description="publication (default: cdc_<name>)")
    tables: list[str] = Field(default_factory=lambda: ["public.*"],
                              description="schema.table globs; 'schema.*' also captures tables created later")
    manage_publication: bool = Field(default=True, description="create the publication / add tables to it")
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict, description="event key for tables without a primary key: {schema.table: [cols]}")
    snapshot_workers: int | None = Field(default=None, ge=1, le=32, description=(
        "parallel snapshot readers (default: min(4, CPU cores)); each reads chunks of the tables inside "
        "the same exported snapshot"))
    snapshot_processes: bool = Field(default=False, description=(
        "run the snapshot readers as child processes (they die with this one), not threads, when the "
        "snapshot has more than one chunk: their COPY reading then runs beside the interpreter lock of "
        "the process that publishes the rows. Off by default: on 2-core machines, where the server and "
        "the broker fill the cores, bench/pg_snapshot.py measured threads as fast or faster"))
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
    max_retained_wal: ByteSize | None = Field(default=None, description=(
        "warn when the slot holds back more WAL than this ('1GB', '512MiB'); also shown as "
        "cdc_retained_wal_bytes in /metrics (measured every wal_check_interval either way)"))
    on_retained_wal: Literal["warn", "drop"] = Field(default="warn", description=(
        "what happens when the slot holds back more than max_retained_wal: 'warn' logs it each "
        "wal_check_interval; 'drop' drops the slot (freeing the WAL) and takes a new snapshot, so it "
        "needs snapshot: when_needed"))
    wal_check_interval: float = Field(default=60.0, gt=0,
                                      description="seconds between two measures of the slot's retained WAL")
    failover_slot: bool = Field(default=True, description=(
        "make the slot a failover slot where the server has them (PostgreSQL 17+): a physical standby "
        "with sync_replication_slots = on keeps a copy of it, so after a promotion capture goes on from "
        "the standby where it stopped; an existing slot is switched to match. Older servers: ignored"))
    protocol_version: int | None = Field(default=None, ge=1, le=4,
                                         description="pgoutput protocol (default: the newest the server has)")

    @property
    def reader_count(self) -> int:
        return self.snapshot_workers or min(4, os.cpu_count() or 1)

    @model_validator(mode="after")
    def _drop_needs_a_budget_and_a_resnapshot(self):
        if self.on_retained_wal == "drop":
            if self.max_retained_wal is None:
                raise ValueError("on_retained_wal: drop needs max_retained_wal (the budget past which the slot "
                                 "is dropped)")
            if self.snapshot is not SnapshotMode.WHEN_NEEDED:
                raise ValueError(f"on_retained_wal: drop needs snapshot: when_needed, not {self.snapshot.value}: "
                                 "after the slot is dropped only a new snapshot can bring the topics up to date")
        return self

    @field_validator("dsn")
    @classmethod
    def _libpq_dsn(cls, value: SecretStr) -> SecretStr:
        # Checked here too, so `cdc validate` names the option with the file's line; the message
        # names the option, never the DSN (it may hold the password).
        problem = servers.postgres.dsn_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return value

    def slot_in(self, database: str) -> str:
        """The slot this source uses in ``database``: the ``slot`` setting, else the default."""
        return self.slot or default_slot_name(database, self.name)

    @property
    def legacy_slot_name(self) -> str:
        """The default before it named the database: kept where such a slot already exists in the
        source's own database, so an upgrade does not strand it (see PostgresSource._choose_slot)."""
        return f"cdc_{self.name.lower().replace('-', '_').replace('.', '_')}"

    @property
    def publication_name(self) -> str:
        return self.publication or f"cdc_{self.name.lower().replace('-', '_').replace('.', '_')}"


SLOT_NAME_MAX = 63  # NAMEDATALEN - 1
_NOT_SLOT_CHARS = re.compile(r"[^a-z0-9_]")


def default_slot_name(database: str, source: str) -> str:
    """``cdc_<database>_<source>`` in PostgreSQL's slot alphabet ``[a-z0-9_]``, at most 63 chars.

    The database is in it because slots are per server while source names repeat across
    databases (two ``shop`` sources on one server). A name too long is cut and ends with eight hex
    digits of a hash of the whole, so two long names differing only at the end do not collide."""
    name = _NOT_SLOT_CHARS.sub("_", f"cdc_{database}_{source}".lower())
    if len(name) <= SLOT_NAME_MAX:
        return name
    digest = hashlib.sha1(f"{database}\0{source}".encode()).hexdigest()[:8]
    return f"{name[:SLOT_NAME_MAX - 9]}_{digest}"
