"""Version-guarded script calls sent in pipelines: bounded, retried, safe to resend.

A write is a list of ``Command`` (a row change, or a raise of an applied version). They go out
in pipelines of ``pipeline_size`` rows, so memory on both sides stays bounded whatever the batch
size. On a single server the rows of a pipeline are grouped ``rows_per_call`` to a script call
(guard.ROWS), and the commands are taken lazily (plan.py makes each as it is taken): the next
pipeline is made and sent before the previous one's replies are read (two in flight: the server
runs one pipeline's scripts while the client makes the next and parses); in a cluster every row is a call of
its own (guard.ROW: its two keys share a slot) and each pipeline is split per master (resp.py).

The rows of one ``run`` are distinct keys (plan.py keeps one change per key), so pipelines may
apply in any order, and every call is idempotent under the version guard: when a pipeline fails
part way (a connection drops, the server answers OOM/BUSY/LOADING/TRYAGAIN, a master fails over)
the whole pipeline is sent again after a backoff (0.2 s doubling to 5 s, ``max_retries`` times),
then the error goes to the runtime as ``RetriableError`` (it retries the batch with its own,
longer backoff). NOSCRIPT (a restarted or failed-over server lost its script cache) loads the
scripts again and resends.

Threading: one thread at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

import sinks.redis.guard as guard
from cdc.api import PermanentError, RetriableError
from sinks.redis.client import is_noscript, is_retriable
from sinks.redis.resp import ClusterSender, SingleSender, bulk, pack_args, pack_call, pack_row, pack_rows

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0
ROWS_PER_CALL = 64


@dataclass(frozen=True, slots=True)
class Command:
    """One change: ``script`` "row" (keys: row key, companion; ``tail``: the row packed once, see
    ``row_tail``) or "applied" (keys: the applied key; args: the version)."""

    script: str
    keys: tuple
    args: tuple = ()
    tail: tuple[int, bytes, bytes, bytes] | None = None


def row_tail(keys: tuple, op: str, version: str, payload: tuple = ()) -> tuple[int, bytes, bytes, bytes]:
    """A row change packed as RESP: (payload count, both keys, op + version, payload)."""
    return len(payload), bulk(keys[0]) + bulk(keys[1]), bulk(op) + bulk(version), pack_args(payload)


def row(keys: tuple, op: str, version: str, payload: tuple = ()) -> Command:
    return Command("row", keys, (), row_tail(keys, op, version, payload))


class ScriptPipeline:
    def __init__(self, client, name: str, pipeline_size: int = 1000, max_retries: int = 6,
                 rows_per_call: int = ROWS_PER_CALL) -> None:
        self.client = client
        self.name = name
        self.pipeline_size = pipeline_size
        self.max_retries = max_retries
        self.single = not hasattr(client, "nodes_manager")
        self.sender = SingleSender(client) if self.single else ClusterSender(client)
        self.rows_per_call = rows_per_call if self.single else 1
        self.shas: dict[str, bytes] = {}

    def load_scripts(self) -> None:
        """SCRIPT LOAD on the server (every master of a cluster)."""
        def load(script: str) -> bytes:
            sha = self.client.script_load(script)
            return sha.encode() if isinstance(sha, str) else sha

        self.shas = {"row": load(guard.ROW), "rows": load(guard.ROWS), "applied": load(guard.APPLIED)}

    def run(self, commands: Iterable[Command], ttls: tuple[int, int] = (0, 0)) -> list:
        """Each command's reply, in order. ``commands`` may be lazy (plan.py makes them as they are
        taken): on a single server each pipeline is made while the server runs the previous one.
        ``ttls``: (live TTL, tombstone retention) in ms for the row changes. Raises
        RetriableError / PermanentError."""
        packed_ttls = bulk(str(ttls[0])) + bulk(str(ttls[1]))
        chunks = _chunks(commands, self.pipeline_size)
        sender = self.sender
        if not self.shas or not isinstance(sender, SingleSender):
            return [reply for chunk in chunks for reply in self._run_chunk(chunk, packed_ttls)]
        made: list[tuple[list[Command], list[int]]] = []

        def packed():
            for chunk in chunks:
                calls, sizes = self._pack(chunk, packed_ttls)
                made.append((chunk, sizes))
                yield calls

        calls = packed()
        outcomes = sender.send_overlapped(calls)
        for _ in calls:  # a connection failed part way: make the rest, to send them one by one
            pass
        replies: list = []
        for index, (chunk, sizes) in enumerate(made):
            outcome = outcomes[index] if index < len(outcomes) else None
            flat = None if outcome is None else _expand(outcome, sizes)
            if flat is not None and not any(isinstance(r, Exception) for r in flat):
                replies.extend(flat)
            else:
                replies.extend(self._run_chunk(chunk, packed_ttls))
        return replies

    def _pack(self, chunk: list[Command], ttls: bytes) -> tuple[list[bytes], list[int]]:
        """The calls of one pipeline and, per call, how many rows it carries (0: one plain reply)."""
        shas = self.shas
        calls: list[bytes] = []
        sizes: list[int] = []
        group: list[Command] = []
        per_call = self.rows_per_call

        def flush() -> None:
            if len(group) == 1:
                tail = group[0].tail
                assert tail is not None, "a row command is made with its tail (row(), plan.py)"
                calls.append(pack_row(shas["row"], ttls, tail))
                sizes.append(0)
            elif group:
                calls.append(pack_rows(shas["rows"], group, ttls))
                sizes.append(len(group))
            group.clear()

        for command in chunk:
            if command.script == "row":
                group.append(command)
                if len(group) >= per_call:
                    flush()
            else:
                flush()
                calls.append(pack_call(shas[command.script], command.keys, command.args))
                sizes.append(0)
        flush()
        return calls, sizes

    def _run_chunk(self, chunk: list[Command], ttls: bytes) -> list:
        backoff = BACKOFF_FIRST
        attempt = 0
        while True:
            try:
                if not self.shas:
                    self.load_scripts()
                calls, sizes = self._pack(chunk, ttls)
                replies = _expand(self.sender.send(calls, _slot_keys(chunk, sizes)), sizes)
                failure = next((r for r in replies if isinstance(r, Exception)), None)
                if failure is None:
                    return replies
                raise failure
            except Exception as err:  # noqa: BLE001 - classified below
                if is_noscript(err):
                    log.info("redis sink %s: the server lost its scripts (restart or failover): loading "
                             "them again", self.name)
                    self.shas = {}
                elif not is_retriable(err):
                    raise PermanentError(f"redis sink {self.name}: {type(err).__name__}: {err}") from err
                attempt += 1
                if attempt > self.max_retries:
                    raise RetriableError(f"redis sink {self.name}: {type(err).__name__}: {err} "
                                         f"({self.max_retries} retries)") from err
                if not is_noscript(err):
                    log.warning("redis sink %s: %s: %s; retrying in %.1fs", self.name, type(err).__name__,
                                err, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)


def _chunks(commands: Iterable[Command], size: int) -> Iterator[list[Command]]:
    iterator = iter(commands)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _slot_keys(chunk: list[Command], sizes: list[int]) -> list:
    """The key that routes each call (a cluster's calls carry one row each)."""
    keys, at = [], 0
    for size in sizes:
        keys.append(chunk[at].keys[0])
        at += max(size, 1)
    return keys


def _expand(replies: list, sizes: list[int]) -> list:
    """Per call replies -> per row replies (a grouped call answers a list, or one error for all)."""
    flat: list = []
    for reply, size in zip(replies, sizes):
        if size == 0:
            flat.append(reply)
        elif isinstance(reply, Exception):
            flat.extend([reply] * size)
        else:
            flat.extend(reply)
    return flat
