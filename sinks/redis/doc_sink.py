"""``type: redis`` with ``documents:``: joined documents as JSON under ``<namespace>:doc:<name>:<id>``
(sinks/documents/engine.py keeps them; the README says what it guarantees).

A write: the batch into the state (one SQLite transaction), then the outbox's documents assembled
and written through the table sink's version guard (guard.py): each document's version lives in
its companion key, a write applies only if newer, and a deleted document leaves ``D<version>``
there for ``tombstone_retention_ms`` (default a day), so nothing older brings it back. ``format:
json`` stores the document as a JSON string, ``redisjson`` as a RedisJSON document. ``<id>`` is the
root row's key encoded as the table sink encodes keys (keys.py).

Generations are the table sink's key namespaces (generations.py): a rebuild writes
``<prefix>.g<N>:doc:...``, then one SET of ``<prefix>.generation`` moves readers.
"""

from __future__ import annotations

import logging
from typing import Any

from cdc.api import PermanentError, RebuildableSink, RetriableError, Sink, SinkEvent
from sinks.documents.engine import Engine, Written
from sinks.documents.keeper import Keeper
from sinks.documents.shared import SharedDocuments
from sinks.redis.client import translate
from sinks.redis.config import RedisSinkConfig
from sinks.redis.keys import companion, encode_component, encode_key, namespace
from sinks.redis.pipeline import row
from sinks.redis.server import open_server

log = logging.getLogger(__name__)

DEFAULT_TOMBSTONE_MS = 24 * 3600 * 1000


def document_key(ns: str, document: str, key: dict[str, Any]) -> str:
    return f"{ns}:doc:{encode_component(document)}:{encode_key(key)}"


class RedisDocumentSink(Sink, RebuildableSink, SharedDocuments):
    config_model = RedisSinkConfig

    def __init__(self, config: RedisSinkConfig, generation: int | None = None) -> None:
        super().__init__(config, generation)
        self.config: RedisSinkConfig = config
        self.client: Any = None
        self.keeper = Keeper(config.name, config, lambda: self.context, self._held_versions)
        self._current = 1
        self._op = "j" if config.format == "redisjson" else "s"

    def start(self) -> None:
        config = self.config
        self.client, self.pipeline, self.generations, self._current = open_server(config)
        log.info("redis sink %s: started, keeping documents %s as %s", config.name,
                 ", ".join(d.name for d in config.documents or []), config.format)

    def stop(self) -> None:
        self.keeper.close()
        if self.client is not None:
            self.generations.wait()
            self.client.close()

    def _writing(self) -> int:
        return self.generation if self.generation is not None else self._current

    def _readers(self) -> int:
        return self._current

    def write(self, events: list[SinkEvent]) -> None:
        if self.client is None:
            raise PermanentError(f"redis sink {self.config.name}: call start() first")
        generation = self._writing()
        engine = self.keeper.apply(events, generation, self._current, self.generation is not None, self.shape_of,
                                   self.config.schema_policy)
        self._flush(engine, generation)
        self.keeper.report(generation)

    def _flush(self, engine: Engine, generation: int, drain: bool = False) -> bool:
        if drain:
            return engine.drain(lambda docs: self._send(docs, generation))
        engine.flush(lambda docs: self._send(docs, generation))
        return False

    def _send(self, docs: list[Written], generation: int) -> list[tuple[Written, str]]:
        ns = namespace(self.config.prefix, generation)
        tombstone_ms = self.config.tombstone_retention_ms or DEFAULT_TOMBSTONE_MS
        commands = []
        for doc in docs:
            key = document_key(ns, doc.document, doc.key)
            if doc.body is None:
                commands.append(row((key, companion(key)), "d", str(doc.version)))
            else:
                commands.append(row((key, companion(key)), self._op, str(doc.version), (doc.body,)))
        self.pipeline.run(commands, (0, tombstone_ms))
        return []

    def _held_versions(self, generation: int, docs: list[tuple[str, dict[str, Any]]]) -> list[int | None]:
        ns = namespace(self.config.prefix, generation)
        out: list[int | None] = []
        try:
            for start in range(0, len(docs), 1000):
                keys = [companion(document_key(ns, doc, key)) for doc, key in docs[start:start + 1000]]
                values = self.client.mget(keys) if not self.config.cluster else [self.client.get(k) for k in keys]
                out += [None if v is None else int(v.decode().lstrip("D")) for v in values]
        except (RetriableError, PermanentError):
            raise
        except Exception as err:  # noqa: BLE001 - classified
            raise translate(err, f"redis sink {self.config.name}: reading documents' versions") from err
        return out

    # --- generations ----------------------------------------------------------------------------

    def current_generation(self) -> int:
        if self.client is None:
            return self._current
        self._current = self.generations.current()
        return self._current

    def open_generation(self, generation: int) -> None:
        self.generations.open(generation)
        self.keeper.opened(generation)
        self.generation = generation

    def switch_generation(self, generation: int) -> None:
        engine = self.keeper.finish(generation, self._current)
        engine.flush(lambda docs: self._send(docs, generation))  # called again after a retriable error: resumes
        self.generations.switch(generation)
        self.keeper.switched(generation)
        self._current = generation
        self.generation = None

    def drop_generation(self, generation: int) -> None:
        if generation == self._writing():
            raise PermanentError(f"redis sink {self.config.name}: generation {generation} is the one being "
                                 f"written; it cannot be dropped")
        self.generations.drop(generation)
        self.keeper.dropped(generation)
