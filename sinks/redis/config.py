"""The ``type: redis`` sink's settings. With ``documents:`` (sinks/documents/declaration.py) the
sink keeps joined documents as JSON instead of a key per row."""

from __future__ import annotations

import string
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from cdc.api import ShapeCheckedConfig, SinkConfig, template_fields
from sinks.documents.declaration import DocumentFields, declaration_problems, refuse
from sinks.documents.shapes_check import ShapeCheckedDocuments

TEMPLATE_FIELDS = ("prefix", "schema", "table", "key")
DEFAULT_KEY_TEMPLATE = "{prefix}:{schema}.{table}:{key}"


class RedisSinkConfig(SinkConfig, DocumentFields, ShapeCheckedDocuments, ShapeCheckedConfig):
    type: Literal["redis"] = "redis"
    url: SecretStr = Field(description="redis://[user@]host:port/db, rediss:// for TLS; for a cluster, "
                                       "any node's address with cluster: true")
    password: SecretStr | None = Field(default=None, description="the password (or password_file: path)")
    database: int | None = Field(default=None, ge=0,
                                 description="database number (default: the URL's, else 0; a cluster has only 0)")
    cluster: bool = Field(default=False, description="Redis Cluster: keys hashed to slots across masters")
    tls_ca_file: str | None = Field(default=None, description="CA bundle that signs the server's certificate "
                                                            "(rediss:// only; default: the system's)")
    tls_cert_file: str | None = Field(default=None, description="client certificate (PEM) for servers that "
                                                              "require one (tls-auth-clients); rediss:// only")
    tls_key_file: str | None = Field(default=None, description="the client certificate's private key (PEM), "
                                                             "if not in tls_cert_file")
    tls_verify: bool = Field(default=True, description="check the server's certificate (rediss:// only)")
    key_prefix: str | None = Field(default=None, pattern=r"^[^{}:*?\[\]\s]+$",
                                   description="first part of every key (default: the sink's name)")
    key_template: str = Field(default=DEFAULT_KEY_TEMPLATE,
                              description="key of a row: {prefix} first, then any of {schema} {table} {key}")
    format: Literal["hash", "json", "redisjson", "invalidate"] = Field(
        default="hash", description="a hash (field per column), a JSON string, a RedisJSON document, or "
                                    "invalidate: delete the key on every change (cache-aside)")
    include: list[str] | None = Field(default=None, description="columns to keep (default: all)")
    exclude: list[str] = Field(default_factory=list, description="columns to leave out")
    rename: dict[str, str] = Field(default_factory=dict, description="column -> field name in the value")
    ttl_seconds: float | None = Field(default=None, gt=0, description="expire live keys after this long")
    tombstone_retention_ms: int | None = Field(
        default=None, gt=0, description="how long a delete's version is kept (default: the topics' "
                                        "delete.retention.ms, else 24 h)")
    pipeline_size: int = Field(default=1000, ge=1, le=100_000,
                               description="commands per pipeline round trip (one in flight at a time)")
    max_retries: int = Field(default=6, ge=0, description="retries of a failed pipeline inside one write")
    schema_policy: Literal["evolve", "fail", "rebuild"] = Field(
        default="evolve", description="a source schema change that changes what values hold: evolve (keys "
                                      "take the new shape at their next change), fail (stop), rebuild (a new "
                                      "generation in the new shape); see README")

    @field_validator("key_template")
    @classmethod
    def _template(cls, template: str) -> str:
        fields = template_fields(template, TEMPLATE_FIELDS)
        if not template.startswith("{prefix}:"):
            raise ValueError("must start with '{prefix}:' (a generation's keys are found by that prefix)")
        if "key" not in fields:
            raise ValueError("must contain {key}: one key per row")
        literal = "".join(text for text, *_ in string.Formatter().parse(template))
        if any(c in literal for c in "{}*?[]"):
            raise ValueError("literal braces and glob characters are not allowed (they change hash slots "
                             "and SCAN patterns)")
        return template

    @model_validator(mode="after")
    def _columns(self) -> RedisSinkConfig:
        if self.include is not None and set(self.include) & set(self.exclude):
            raise ValueError(f"columns both included and excluded: {sorted(set(self.include) & set(self.exclude))}")
        if self.cluster and self.database not in (None, 0):
            raise ValueError("a Redis Cluster has only database 0")
        tls = [name for name in ("tls_ca_file", "tls_cert_file", "tls_key_file") if getattr(self, name)]
        if tls and not self.url.get_secret_value().startswith("rediss://"):
            # Refused rather than ignored: the user asked for TLS and would get plain text.
            raise ValueError(f"{', '.join(tls)} set but url is not rediss:// (TLS)")
        if self.tls_key_file and not self.tls_cert_file:
            raise ValueError("tls_key_file needs tls_cert_file (the certificate it belongs to)")
        return self

    @model_validator(mode="after")
    def _documents(self) -> RedisSinkConfig:
        if self.documents is None:
            return self
        problems = declaration_problems(self.documents, "redis")
        if self.format not in ("json", "redisjson"):
            problems.append((("format",), f"a document is JSON: format json or redisjson, not {self.format}"))
        # Refused, not ignored: they shape a key per row, which a sink with documents does not keep.
        for option in ("include", "exclude", "rename", "key_template"):
            if option in self.model_fields_set:
                problems.append(((option,), f"a sink with documents keeps only documents (keys "
                                            f"<prefix>:doc:<name>:<id>): give {option} on each document's nodes"
                                 if option != "key_template" else
                                 "a sink with documents keys them <prefix>:doc:<name>:<id>"))
        refuse(problems, type(self).__name__)
        return self


    @property
    def prefix(self) -> str:
        return self.key_prefix or self.name
