"""The ``type: sql`` sink's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from cdc.api import SinkConfig, resolve_config_path, template_fields

TEMPLATE_FIELDS = ("schema", "db", "table")
FILE_DATABASES = frozenset({"sqlite", "duckdb"})  # URL schemes whose database is a local file


class SqlSinkConfig(SinkConfig):
    # ``schema`` is the name users write, but it shadows a BaseModel attribute: the field is
    # ``target_schema`` with ``schema`` as its alias (both are accepted).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    type: Literal["sql"] = "sql"
    url: SecretStr = Field(description="SQLAlchemy URL: postgresql+psycopg2://, mysql+pymysql://, "
                                       "sqlite:///path, duckdb:///path (mysql:// means mysql+pymysql://); a "
                                       "relative file path is relative to the config file's directory")
    target_schema: str | None = Field(default=None, alias="schema",
                                      description="schema (MySQL: database) of the target tables; "
                                                  "created if missing. Not for SQLite.")
    table_name: str = Field(default="{table}",
                            description="target table name: a template of the source table's "
                                        "{schema}, {db} and {table}")
    soft_delete: bool = Field(default=False,
                              description="mark deleted rows (__cdc_deleted = true) instead of removing them")
    schema_policy: Literal["fail", "evolve", "ignore", "rebuild"] = Field(
        default="fail", description="a source change of a column's type or of the key: stop; change the "
                                    "column in place where no value can be lost, else stop (evolve); write "
                                    "NULL into the columns that no longer fit (ignore); or rebuild into a new "
                                    "generation while readers keep the old one (rebuild). New columns are "
                                    "added under every policy")
    write_timeout: float | None = Field(
        default=60, gt=0, description="seconds a write may wait for the target's answers (PostgreSQL, MySQL); "
                                      "past that its connections are closed and the batch is retried on new "
                                      "ones (a hung server or a network that drops packets). null: no limit")
    connect_timeout: int = Field(default=15, gt=0, description="seconds to open a connection to the target "
                                                               "(PostgreSQL, MySQL)")
    write_connections: int = Field(
        default=2, ge=1, le=16,
        description="PostgreSQL: connections a large write is applied over at once, its keys split "
                    "between them, one transaction each, all committed before the write returns (the "
                    "server's side of a write then runs on that many cores); 1: one transaction per write")
    delete_memory_hours: float = Field(default=168, gt=0,
                                       description="how long a deleted key's version is remembered, so a "
                                                   "late older insert cannot bring the row back")

    @field_validator("url", mode="after")
    @classmethod
    def _file_relative_to_config(cls, url: SecretStr, info: ValidationInfo) -> SecretStr:
        """``sqlite:///data.db`` names a file relative to the config file, not to wherever the
        daemon was started (SQLAlchemy would take it from the working directory)."""
        text = url.get_secret_value()
        scheme, sep, rest = text.partition(":///")
        if not sep or scheme.split("+")[0] not in FILE_DATABASES:
            return url
        file, query_sep, query = rest.partition("?")
        if not file or file.startswith("/") or file == ":memory:":
            return url
        resolved = resolve_config_path(file, info)
        return SecretStr(f"{scheme}:///{resolved}{query_sep}{query}")

    @field_validator("table_name")
    @classmethod
    def _known_fields(cls, template: str) -> str:
        template_fields(template, TEMPLATE_FIELDS)
        return template
