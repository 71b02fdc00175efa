"""Versioned bulk writes: NDJSON requests sized in documents and bytes, several in flight.

Every item is an ``index`` with ``version_type=external`` (or ``external_gte`` for a tombstone
that takes over a document's own version, see tombstones.py): OpenSearch applies it only if the
version is higher than the document's, so a replay never moves a document backwards and an equal
version is a no-op. Such a refusal is a 409 ``version_conflict_engine_exception``: expected on
replays, counted as ``conflicts``, not an error.

Items refused for a retriable reason (429 / ``es_rejected_execution_exception``: the node's write
queue is full; 5xx) are sent again after a backoff (0.2 s doubling, a few times), then the call
raises ``RetriableError`` and the runtime retries the batch (versions make that safe). Items
refused for good (a mapping error) are returned in ``refused`` with OpenSearch's reason; the rest
of the batch is written.

A write may come in parts (``sending``: the sink encodes a request's worth of documents at a
time and each part's requests go out at once, so the node indexes the first while the rest is
encoded); it has returned, as ``send`` has, once every request of every part has.

Threading: ``send`` may run several requests at once on its own pool (``concurrency``); the
client is thread-safe. One caller thread at a time.
"""

from __future__ import annotations

import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from cdc.api import RetriableError
from sinks.opensearch.errors import item_retriable, translate

log = logging.getLogger(__name__)

RETRIES, FIRST_BACKOFF_S = 5, 0.2
_FILTER = "errors,items.*.status,items.*.error.type,items.*.error.reason"


class Item(NamedTuple):
    """One bulk item. A tuple: a write makes one per document (see documents.py)."""

    # The target index, named as in the bulk API; it shadows tuple.index(), which nothing calls.
    index: str  # type: ignore[assignment]  # see above
    doc_id: str
    version: int
    body: dict[str, Any]
    event: Any = None                 # the SinkEvent it comes from (for the dead letters)
    version_type: str = "external"
    # The item encoded already (lines.py makes a write's items with their lines in one pass; its
    # ``body`` is then the document without the version field, which is in the line: the JSON
    # bytes of it for a row the runtime left as bytes, raw_rows).
    line: bytes | None = None

    def encode(self) -> bytes:
        if self.line is not None:
            return self.line
        return action_line(self.index, self.doc_id, self.version, self.version_type) + \
            orjson.dumps(self.body, option=orjson.OPT_NON_STR_KEYS) + b"\n"


def action_line(index: str, doc_id: str, version: int, version_type: str = "external") -> bytes:
    """An index action's line, by hand (names and ids escaped by orjson)."""
    return b'{"index":{"_index":%b,"_id":%b,"version":%d,"version_type":"%b"}}\n' % (
        _quoted(index), orjson.dumps(doc_id), version, _VERSION_TYPES[version_type])


_VERSION_TYPES = {"external": b"external", "external_gte": b"external_gte"}


@functools.lru_cache(maxsize=1024)
def _quoted(index: str) -> bytes:
    """An index name as a JSON string (a batch names a few indexes, each thousands of times)."""
    return orjson.dumps(index)


def per_request(count: int, max_docs: int, concurrency: int) -> int:
    """Documents per request for a write of ``count`` documents: at most ``max_docs``, and evened
    out so the requests fill every slot of ``concurrency`` in each round. With fixed chunks
    (10,000 documents as 2,000-document requests, 2 in flight) the fifth request of every write
    ran alone while the other slot idled: a write's time was three requests' instead of 2.5."""
    if concurrency <= 1 or count <= max_docs:
        return max_docs
    rounds = -(-count // (max_docs * concurrency))
    return -(-count // (rounds * concurrency))


@dataclass(slots=True)
class Outcome:
    written: int = 0
    conflicts: int = 0
    refused: list[tuple[Item, str]] = field(default_factory=list)


class BulkWriter:
    def __init__(self, client, *, max_docs: int, max_bytes: int, concurrency: int, what: str,
                 hosts=()) -> None:
        self.client = client
        self.hosts = hosts  # for messages (errors.shown)
        self.max_docs, self.max_bytes = max_docs, max_bytes
        self.concurrency = concurrency
        self.what = what
        self.pool: ThreadPoolExecutor | None = None
        self.open()

    def open(self) -> None:
        """The request threads (a sink started again after a stop gets new ones)."""
        if self.pool is None and self.concurrency > 1:
            self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="bulk")

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def send(self, items: list[Item], lines: list[bytes] | None = None) -> Outcome:
        """Write ``items``; ``lines``: their encodings, made already (else ``Item.encode``)."""
        sending = self.sending(len(items))
        sending.add(items, lines if lines is not None else [item.encode() for item in items])
        return sending.finish()

    def sending(self, expected: int) -> Sending:
        """A write whose items come in parts (``Sending.add``), each part's requests sent at once:
        the node indexes the first documents of a write while the sink encodes the next.
        ``expected``: about how many documents the write has (to even out the requests)."""
        return Sending(self, per_request(expected, self.max_docs, self.concurrency))

    def _retry(self, retry: list[tuple[Item, str]], total: int, outcome: Outcome) -> Outcome:
        """Send the items refused for now again, after a backoff, a few times; then raise."""
        backoff = FIRST_BACKOFF_S
        pending = total
        for _attempt in range(1, RETRIES + 1):
            log.warning("%s: %d of %d documents refused for now (%s); sending them again in %.1fs", self.what,
                        len(retry), pending, retry[0][1], backoff)
            time.sleep(backoff)
            backoff *= 2
            items = [item for item, _ in retry]
            pending = len(items)
            retry = self._send_once(items, outcome)
            if not retry:
                return outcome
        raise RetriableError(f"{self.what}: OpenSearch kept refusing {len(retry)} documents for now "
                             f"({retry[0][1]}); the batch will be retried")

    def _send_once(self, items: list[Item], outcome: Outcome) -> list[tuple[Item, str]]:
        chunks = self._chunks(items, [item.encode() for item in items], self.max_docs)
        if self.pool is None:
            results = [self._request(chunk) for chunk in chunks]
        else:
            futures = [self.pool.submit(self._request, chunk) for chunk in chunks]
            results = [future.result() for future in futures]
        retry: list[tuple[Item, str]] = []
        for chunk_items, answer in results:
            self._classify(chunk_items, answer, outcome, retry)
        return retry

    def _chunks(self, items: list[Item], lines: list[bytes], max_docs: int):
        """Requests of at most ``max_docs`` documents and ``max_bytes`` bytes, as (items, body).
        Cut by slices of the lists: a request of documents that fit costs one sum of their sizes
        and one join, nothing per document in Python."""
        max_bytes = self.max_bytes
        start, count = 0, len(items)
        while start < count:
            end = min(start + max_docs, count)
            size = sum(map(len, lines[start:end]))
            if size > max_bytes:  # fewer documents: as many as fit (at least one)
                end, size = start + 1, len(lines[start])
                while end < count and end - start < max_docs and size + len(lines[end]) <= max_bytes:
                    size += len(lines[end])
                    end += 1
            yield items[start:end], b"".join(lines[start:end])
            start = end

    def _request(self, chunk: tuple[list[Item], bytes]) -> tuple[list[Item], dict]:
        chunk_items, payload = chunk
        try:
            answer = self.client.bulk(body=payload, params={"filter_path": _FILTER})
        except Exception as err:  # noqa: BLE001 - classified by translate
            raise translate(err, self.what, self.hosts) from err
        return chunk_items, answer

    @staticmethod
    def _classify(items: list[Item], answer: dict, outcome: Outcome, retry: list) -> None:
        if not answer.get("errors"):
            outcome.written += len(items)
            return
        for item, result in zip(items, answer["items"], strict=True):
            (result,) = result.values()
            status = result.get("status", 0)
            if status < 300:
                outcome.written += 1
                continue
            error = result.get("error") or {}
            error_type = error.get("type")
            reason = f"{status} {error_type}: {error.get('reason')}"
            if status == 409 and error_type == "version_conflict_engine_exception":
                outcome.conflicts += 1
            elif item_retriable(status, error_type):
                retry.append((item, reason))
            else:
                outcome.refused.append((item, reason))


class Sending:
    """One write of a ``BulkWriter`` in parts: ``add`` cuts a part into requests and sends them
    (on the writer's pool: ``concurrency`` in flight, the rest queued), ``finish`` waits for
    all of them, sends what was refused for now again (backoff, a few times) and returns the
    outcome. A write that ends another way (an error while encoding) must call ``abandon``: no
    request outlives the write."""

    def __init__(self, writer: BulkWriter, max_docs: int) -> None:
        self.writer = writer
        self.max_docs = max_docs
        self.results: list = []  # futures, or (items, answer) where requests run inline
        self.total = 0

    def add(self, items: list[Item], lines: list[bytes]) -> None:
        writer = self.writer
        self.total += len(items)
        for chunk in writer._chunks(items, lines, self.max_docs):
            self.results.append(writer._request(chunk) if writer.pool is None
                                else writer.pool.submit(writer._request, chunk))

    def finish(self) -> Outcome:
        outcome = Outcome()
        retry: list[tuple[Item, str]] = []
        results, self.results = self.results, []
        try:
            for result in results:
                chunk_items, answer = result if type(result) is tuple else result.result()
                self.writer._classify(chunk_items, answer, outcome, retry)
        except BaseException:
            _wait_all(results)
            raise
        return self.writer._retry(retry, self.total, outcome) if retry else outcome

    def abandon(self) -> None:
        results, self.results = self.results, []
        _wait_all(results)


def _wait_all(results: list) -> None:
    for result in results:
        if type(result) is not tuple:
            result.exception()  # waited for; its error, if any, is the one raised already or moot
