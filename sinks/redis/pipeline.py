"""Version-guarded commands sent in pipelines: bounded, retried, safe to resend.

A write is a list of ``Command`` (one script call each). They go out in pipelines of
``pipeline_size`` calls, one pipeline in flight at a time, so memory on both sides stays bounded
whatever the batch size. In a cluster, redis-py splits each pipeline per master and follows
MOVED/ASK redirections; every call touches the keys of one slot.

Every call is idempotent under the version guard, so when a pipeline fails part way (a connection
drops, the server answers OOM/BUSY/LOADING/TRYAGAIN, a master fails over) the whole pipeline is
sent again after a backoff (0.2 s doubling, ``max_retries`` times), then the error goes to the
runtime as ``RetriableError`` (it retries the batch with its own, longer backoff). NOSCRIPT (a
restarted or failed-over server lost its script cache) loads the scripts again and resends.

Threading: one thread.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cdc.api import PermanentError, RetriableError
from sinks.redis import guard
from sinks.redis.client import is_noscript, is_retriable
from sinks.redis.resp import ClusterSender, SingleSender, pack_call

log = logging.getLogger(__name__)

BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0


@dataclass(frozen=True, slots=True)
class Command:
    """One script call: ``script`` ("row" or "applied"), its keys (the first routes it in a
    cluster) and its arguments; ``tail`` is the arguments already packed (plan.py packs them as
    it builds them, see resp.py), then ``args`` is only for reading."""

    script: str
    keys: tuple
    args: tuple = ()
    tail: tuple[int, bytes] | None = None


class ScriptPipeline:
    def __init__(self, client, name: str, pipeline_size: int = 1000, max_retries: int = 6) -> None:
        self.client = client
        self.sender = ClusterSender(client) if hasattr(client, "nodes_manager") else SingleSender(client)
        self.name = name
        self.pipeline_size = pipeline_size
        self.max_retries = max_retries
        self.shas: dict[str, str] = {}

    def load_scripts(self) -> None:
        """SCRIPT LOAD on the server (every master of a cluster)."""
        def load(script: str) -> bytes:
            sha = self.client.script_load(script)
            return sha.encode() if isinstance(sha, str) else sha

        self.shas = {"row": load(guard.ROW), "applied": load(guard.APPLIED)}

    def run(self, commands: list[Command]) -> list:
        """Each command's reply, in order. Raises RetriableError / PermanentError."""
        replies: list = []
        size = self.pipeline_size
        for start in range(0, len(commands), size):
            replies.extend(self._run_chunk(commands[start:start + size]))
        return replies

    def _run_chunk(self, chunk: list[Command]) -> list:
        backoff = BACKOFF_FIRST
        attempt = 0
        while True:
            try:
                if not self.shas:
                    self.load_scripts()
                replies = self._send(chunk)
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

    def _send(self, chunk: list[Command]) -> list:
        shas = self.shas
        packed = [pack_call(shas[c.script], c.keys, c.args, c.tail) for c in chunk]
        return self.sender.send(packed, [c.keys[0] for c in chunk])
