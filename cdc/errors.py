"""One error tree for the whole framework. Every error says whether retrying can help.

    CdcError                        .retriable: may the same call succeed later?
    ├── RetriableError              yes: network, broker or server unavailable, lock timeouts
    │   └── LogUnavailableError     the log (Kafka broker, embedded file) cannot be reached now
    ├── PermanentError              no: something must be changed first
    │   ├── ConfigError             a config file is invalid; .problems lists each (file, line, path);
    │   │                           or a setting the server refuses (a login, a database name, a
    │   │                           connection option): the message names the setting
    │   │   └── PluginNotFoundError a source/sink ``type`` that no installed plugin provides
    │   ├── TopicConfigError        an existing topic is not set up as the contract needs (not compacted)
    │   ├── SchemaChangeError       a sink's target cannot follow a source schema change (policy: fail)
    │   │   ├── RebuildRequired     ... and the policy says rebuild it from the topic
    │   │   └── ShapeMissingError   rows name a shape the schema topic never delivered (names the
    │   │                           topic, partition, offset, table and the version)
    │   ├── DecodeError             bytes from a database log that cannot be decoded (names where)
    │   ├── PrerequisiteError       the database is not set up for capture, or the role lacks a
    │   │                           grant; the message says the fix and names the role
    │   ├── PositionLostError       the stored position is gone from the server (slot lost, binlog
    │   │                           purged); the message names the recovery (a new snapshot)
    │   └── DevStackError           the local stack of servers could not be set up or started
    └── DeliveryError               the log refused or lost a record; retriable per its error code

``err.heals`` (permanent errors): may the cause go away without a decision here, so that starting
the connector again later can succeed (a grant given, a database created, a lock freed, a secret
file corrected)? The daemon's ``retry_failed`` policy restarts only those. A schema change the
policy refuses, undecodable bytes and a lost position need someone to act (``cdc rebuild``, a fix,
``cdc drop``): they do not heal.

Code that catches errors decides on ``err.retriable``, never on message text. Server errors are
classified by their code where they are wrapped: database errors by ``cdc.servers.postgres``
(SQLSTATE) and ``cdc.servers.mysql`` (errno), one table per server kind shared by sources and sinks;
Kafka errors by their error code in ``cdc.log``.
"""

from __future__ import annotations

from dataclasses import dataclass


class CdcError(Exception):
    retriable: bool = False
    heals: bool = True

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class RetriableError(CdcError):
    retriable = True


class PermanentError(CdcError):
    retriable = False


class LogUnavailableError(RetriableError):
    """The log cannot be reached now (broker down, timeout)."""


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    file: str
    line: int | None
    path: str           # dotted field path, e.g. "sources[0].slot"
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.path or '<root>'}: {self.message}"


class ConfigError(PermanentError):
    def __init__(self, problems: list[ConfigProblem] | str, *, message: str | None = None) -> None:
        if isinstance(problems, str):
            message, problems = problems, [ConfigProblem("<config>", None, "", problems)]
        self.problems = problems
        super().__init__(message or "\n".join(str(p) for p in problems))


class PluginNotFoundError(ConfigError):
    pass


class TopicConfigError(PermanentError):
    pass


class SchemaChangeError(PermanentError):
    heals = False


class RebuildRequired(SchemaChangeError):
    """The sink's policy asks for a rebuild (``cdc rebuild``) to follow a schema change."""


class ShapeNotYetPublished(RetriableError):
    """Rows of ``topic`` name schema version ``version``, which the schema topic does not hold
    (yet): on Kafka a shape may show a moment after the rows that name it. ``waited``: seconds
    since the runtime first missed it, for the bound that turns this into ``ShapeMissingError``."""

    def __init__(self, message: str, *, topic: str, version: int, waited: float) -> None:
        super().__init__(message)
        self.topic, self.version, self.waited = topic, version, waited


class ShapeMissingError(SchemaChangeError):
    """Rows name a schema version the schema topic did not deliver within the sink's
    ``schema_wait``: the sink stops at the first such row (its offset is never committed), because
    writing it under a guessed shape could lose data. Names where: topic, partition, offset,
    table, version."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int, table: str,
                 version: int | None) -> None:
        super().__init__(message)
        self.topic, self.partition, self.offset = topic, partition, offset
        self.table, self.version = table, version


class DecodeError(PermanentError):
    heals = False


class PrerequisiteError(PermanentError):
    pass


class PositionLostError(PermanentError):
    heals = False


class DeliveryError(CdcError):
    """A record was not delivered. ``retriable`` comes from the log's error code."""


class FormatError(PermanentError):
    """A table or record the log's format cannot carry (a column name Avro does not allow), or a
    record of a format this reader does not read."""

    heals = False


class SchemaRegistryError(CdcError):
    """The schema registry refused a schema (``retriable`` False: an incompatible change, named
    with the subject and the registry's reason) or could not be reached (``retriable`` True)."""


class DevStackError(PermanentError):
    """A server of the local stack could not be installed, started or reached."""
