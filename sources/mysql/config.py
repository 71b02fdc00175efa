"""The ``type: mysql`` source's settings."""

from __future__ import annotations

from typing import Literal
from urllib.parse import unquote, urlparse

from pydantic import Field, SecretStr, field_validator

from cdc.api import SourceConfig
from snapshot.signals import IncrementalSettings


class MySqlConfig(SourceConfig, IncrementalSettings):
    type: Literal["mysql"] = "mysql"
    url: SecretStr = Field(description="mysql://user:password@host:port; the user needs REPLICATION SLAVE, "
                                       "REPLICATION CLIENT (BINLOG MONITOR) and SELECT, and RELOAD for "
                                       "a parallel snapshot")
    server_id: int = Field(ge=1, le=2**32 - 1,
                           description="replica server id of this connector: unique among the server's replicas")
    tables: list[str] = Field(default_factory=lambda: ["*.*"],
                              description="db.table globs; 'db.*' also captures tables created later")
    key_columns: dict[str, list[str]] = Field(
        default_factory=dict, description="event key for tables without a primary key: {db.table: [cols]}")
    gtid: bool = Field(default=True, description="resume by GTID position where the server has GTIDs "
                                                 "(else by binlog file and position)")
    snapshot_workers: int = Field(default=2, ge=1, le=32, description="parallel snapshot readers")
    snapshot_chunk_rows: int = Field(default=50_000, ge=1,
                                     description="rows per snapshot chunk (integer primary keys are split)")
    snapshot_lock_timeout: float = Field(
        default=10.0, gt=0, description="seconds to wait for FLUSH TABLES WITH READ LOCK before falling back "
                                        "to one lock-free reader")
    heartbeat_interval: float = Field(default=0.2, gt=0, le=60,
                                      description="seconds of binlog silence after which the server sends a "
                                                  "heartbeat (bounds how long a poll blocks)")
    connect_timeout: float = Field(default=10.0, gt=0)

    @field_validator("url")
    @classmethod
    def _mysql_url(cls, value: SecretStr) -> SecretStr:
        parsed = urlparse(value.get_secret_value())
        if parsed.scheme not in ("mysql", "mariadb") or not parsed.hostname:
            raise ValueError("expected mysql://user:password@host:port")
        return value

    def connection_settings(self) -> dict:
        """pymysql.connect keyword arguments (no database selected)."""
        parsed = urlparse(self.url.get_secret_value())
        return {"host": parsed.hostname, "port": parsed.port or 3306,
                "user": unquote(parsed.username or "root"), "password": unquote(parsed.password or ""),
                "connect_timeout": self.connect_timeout, "charset": "utf8mb4"}
