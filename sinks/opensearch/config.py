"""The ``type: opensearch`` sink's settings. With ``documents:`` (sinks/documents/declaration.py)
the sink keeps joined documents instead of an index per table."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from cdc.api import ShapeCheckedConfig, SinkConfig, template_fields
from sinks.documents.declaration import DocumentFields, declaration_problems, refuse
from sinks.documents.shapes_check import ShapeCheckedDocuments

TEMPLATE_FIELDS = ("topic", "schema", "db", "table")
# OpenSearch 2.x (what this sink is tested against) has no API keys: its security plugin takes
# `Authorization: ApiKey` only from 3.7 on. A header the node ignores would fail as 401 at the
# first request, far from the config line that caused it; so the option is refused here.
API_KEY_REFUSED = ("api_key (api_key_file): OpenSearch 2.x has no API keys (its security plugin accepts "
                   "'Authorization: ApiKey' from OpenSearch 3.7 on, which this sink is not tested against); "
                   "authenticate with username and password (password_file), or with a client certificate "
                   "(client_cert_file, client_key_file) that the node's clientcert authentication maps to a user")


class IndexOptions(BaseModel):
    """What one table's index holds, and how it is set up. Keyed in ``tables:`` by ``schema.table``
    (MySQL: ``db.table``) or a glob of it; the first matching entry applies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    include: list[str] | None = Field(default=None, description="only these columns (default: all)")
    exclude: list[str] = Field(default_factory=list, description="columns left out of the document")
    rename: dict[str, str] = Field(default_factory=dict, description="column -> field name in the document")
    mappings: dict[str, Any] = Field(default_factory=dict,
                                     description="field -> OpenSearch mapping, over the one made from the "
                                                 "source type (by field name, after renames)")
    settings: dict[str, Any] = Field(default_factory=dict,
                                     description="index settings (analysis, shards, ...) over the sink's `settings`")

    @model_validator(mode="after")
    def _no_overlap(self) -> IndexOptions:
        if self.include is not None and set(self.include) & set(self.exclude):
            raise ValueError(f"columns both included and excluded: {sorted(set(self.include) & set(self.exclude))}")
        return self


class OpenSearchSinkConfig(SinkConfig, DocumentFields, ShapeCheckedDocuments, ShapeCheckedConfig):
    type: Literal["opensearch"] = "opensearch"
    # Larger than the base default: a batch is cut into several bulk requests that go in flight
    # together (bulk_max_docs, bulk_concurrency).
    batch_size: int = Field(default=8000, ge=1, description="events per write at most")
    hosts: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:9200"], min_length=1,
                             description="node URLs (http:// or https://)")
    username: str | None = Field(default=None, description="basic auth user")
    password: SecretStr | None = Field(default=None, description="basic auth password (password_file: a path)")
    # Refused with the reason (see _no_api_key): kept as a field so that a config naming it gets
    # that reason, not "extra fields not permitted".
    api_key: SecretStr | None = Field(default=None, description="not supported: OpenSearch 2.x has no API keys; "
                                                                 "use username/password or client_cert_file")
    ca_file: str | None = Field(default=None, description="CA bundle (PEM) that signs the nodes' certificates")
    client_cert_file: str | None = Field(
        default=None, description="client certificate (PEM) presented over TLS: with the security plugin's "
                                  "clientcert authentication, the sink authenticates with it and needs no password")
    client_key_file: str | None = Field(default=None, description="the client certificate's private key (PEM), "
                                                                  "if not in client_cert_file")
    verify_certs: bool = Field(default=True, description="check the nodes' TLS certificates (keep it on)")
    request_timeout_s: float = Field(default=60, gt=0)
    index_name: str = Field(default="{topic}",
                            description="the alias readers query, per table: a template of {topic}, {schema}, "
                                        "{db}, {table}; lowercased. Generations are <name>__g<N>")
    tables: dict[str, IndexOptions] = Field(default_factory=dict,
                                            description="per table (schema.table or a glob): columns, renames, "
                                                        "mappings, settings")
    settings: dict[str, Any] = Field(default_factory=dict, description="index settings for every index")
    schema_policy: Literal["fail", "ignore", "rebuild"] = Field(
        default="rebuild", description="a source schema change the mapping cannot follow (a column's type): "
                                       "stop, write on regardless (refused documents go to the dead letters), "
                                       "or rebuild the indexes into a new generation")
    tombstone_retention_hours: float | None = Field(
        default=None, gt=0, description="how long a delete is remembered (a hidden tombstone document); "
                                        "default: the topic's delete.retention.ms (24 h if the log does not "
                                        "say). Never shorter than that, or a replay can resurrect a row")
    drop_old_generation_after_s: float = Field(
        default=600, ge=0, description="after a rebuild switched readers, how long the old generation is "
                                       "kept (for readers still scrolling it) before it is dropped")
    bulk_max_docs: int = Field(default=2000, ge=1, description="documents per bulk request at most")
    bulk_max_bytes: int = Field(default=5_000_000, ge=1024, description="bytes per bulk request at most")
    bulk_concurrency: int = Field(default=2, ge=1, le=16, description="bulk requests in flight at once")
    writes_in_flight: int = Field(
        default=2, ge=1, le=3, description="writes (batches) submitted and not yet completed at most: the next "
                                           "batch is reduced, encoded and queued while the node indexes the "
                                           "one before, so it never idles between writes; each holds its "
                                           "events and requests in memory (1: one write at a time)")

    @model_validator(mode="after")
    def _auth(self) -> OpenSearchSinkConfig:
        if self.api_key is not None:
            raise ValueError(API_KEY_REFUSED)
        if (self.username is None) != (self.password is None):
            raise ValueError("basic auth needs both username and password")
        if self.client_key_file is not None and self.client_cert_file is None:
            raise ValueError("client_key_file is set but client_cert_file is not")
        if self.client_cert_file is not None and not all(h.startswith("https://") for h in self.hosts):
            raise ValueError("client_cert_file is set but not every host is https:// (a client certificate "
                             "is presented over TLS only)")
        return self

    @field_validator("index_name")
    @classmethod
    def _known_fields(cls, template: str) -> str:
        template_fields(template, TEMPLATE_FIELDS)
        return template

    @model_validator(mode="after")
    def _documents(self) -> OpenSearchSinkConfig:
        if self.documents is None:
            return self
        problems = declaration_problems(self.documents, "opensearch")
        # Refused, not ignored: with documents the sink keeps no index per table.
        if self.tables:
            problems.append((("tables",), "a sink with documents keeps only documents: give columns, mappings "
                                          "and settings on each document's nodes"))
        if "index_name" in self.model_fields_set:
            problems.append((("index_name",), "a document's alias is its name; a sink with documents has no "
                                              "index per table"))
        refuse(problems, type(self).__name__)
        return self

