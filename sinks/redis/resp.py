"""Script calls packed as RESP and sent on redis-py's connections, per server or per cluster node.

redis-py's pipelines spend most of a guarded write's client time packing arguments one by one
(bench/redis_sink.py); a script call here is one bytes join with its constant head packed once.
Replies are read with redis-py's own parser; an error reply becomes that call's exception (as
``execute(raise_on_error=False)`` does), so the pipeline can classify it.

In a cluster the calls are grouped by the master that serves their slot (redis-py's slot table),
each group is sent to its node before any reply is read, then each node's replies are read. A call
answered MOVED is sent again after the slot table is refreshed; ASK is followed to the named node
with ASKING first. A node that cannot be reached raises its connection error for the pipeline to
retry (a failover moves the slots; the refresh finds them).

Threading: one caller at a time per sender.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.exceptions import AskError, ConnectionError, MovedError, ResponseError, TimeoutError

MAX_REDIRECTS = 5


def bulk(arg) -> bytes:
    """One RESP bulk string (str is UTF-8 encoded)."""
    if isinstance(arg, str):
        arg = arg.encode()
    return b"$%d\r\n%b\r\n" % (len(arg), arg)


def pack_args(args) -> bytes:
    return b"".join([bulk(a) for a in args])


def _head(sha: bytes, numkeys: int, count: int) -> bytes:
    """``*<count> EVALSHA <sha> <numkeys>``; ``count``: every element, EVALSHA included."""
    keys = b"%d" % numkeys
    return b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (count, len(sha), sha, len(keys), keys)


def pack_call(sha: bytes, keys: tuple, args: tuple = ()) -> bytes:
    """``EVALSHA sha numkeys keys... args...`` as one RESP array."""
    return (_head(sha, len(keys), 3 + len(keys) + len(args)) + b"".join([bulk(k) for k in keys])
            + b"".join([bulk(a) for a in args]))


_COUNTS = [bulk(b"%d" % n) for n in range(256)]  # a row's payload count, packed once


def pack_row(sha: bytes, ttls: bytes, row: tuple[int, bytes, bytes, bytes]) -> bytes:
    """guard.ROW for one row: ``row`` is (payload count, packed keys, packed op+version, packed payload)."""
    count, keys, op_version, payload = row
    return _head(sha, 2, 3 + 2 + 2 + 2 + count) + keys + ttls + op_version + payload


def pack_rows(sha: bytes, calls: list, ttls: bytes) -> bytes:
    """guard.ROWS for many rows of one server: ``calls`` have ``tail`` as for pack_row."""
    tails = [call.tail for call in calls]
    parts = [tail[1] for tail in tails]
    parts.append(ttls)
    count = 3 + 2 * len(calls) + 2 + 3 * len(calls)
    counts = _COUNTS
    for n, _, op_version, payload in tails:
        parts.append(op_version)
        parts.append(counts[n] if n < 256 else bulk(b"%d" % n))
        parts.append(payload)
        count += n
    return _head(sha, 2 * len(calls), count) + b"".join(parts)


def _exchange(pool, payload: bytes, replies: int) -> list:
    conn = pool.get_connection()
    try:
        conn.send_packed_command([payload])
        out = []
        for _ in range(replies):
            try:
                out.append(conn.read_response())
            except ResponseError as err:
                out.append(err)
        return out
    except (ConnectionError, TimeoutError, OSError):
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


class SingleSender:
    def __init__(self, client) -> None:
        self.client = client

    def send(self, packed: list[bytes], slot_keys: list) -> list:
        return _exchange(self.client.connection_pool, b"".join(packed), len(packed))

    def send_overlapped(self, chunks: Iterable[list[bytes]]) -> list:
        """Each chunk's replies, in order, for the chunks it got to: ``chunks`` is consumed lazily,
        and chunk k+1 is taken (made by the caller: planned and packed) and sent before chunk k's
        replies are read, so the server runs one chunk's scripts while the client makes the next.
        When the connection fails it stops: the chunks without an outcome are the caller's to
        retry (the iterator is left where it stopped)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        outcomes: list = []

        def replies(chunk: list[bytes]) -> list:
            out = []
            for _ in chunk:
                try:
                    out.append(conn.read_response())
                except ResponseError as err:
                    out.append(err)
            return out

        try:
            previous = None
            for chunk in chunks:
                conn.send_packed_command([b"".join(chunk)])
                if previous is not None:
                    outcomes.append(replies(previous))
                previous = chunk
            if previous is not None:
                outcomes.append(replies(previous))
        except (ConnectionError, TimeoutError, OSError):
            conn.disconnect()  # the chunks without an outcome are retried one by one
        finally:
            pool.release(conn)
        return outcomes


class ClusterSender:
    def __init__(self, client) -> None:
        self.client = client

    def send(self, packed: list[bytes], slot_keys: list) -> list:
        client = self.client
        replies: list = [None] * len(packed)
        todo = list(range(len(packed)))
        asking: dict[int, str] = {}
        for _ in range(MAX_REDIRECTS + 1):
            groups: dict[str, list[int]] = {}
            nodes = {}
            for i in todo:
                if i in asking:
                    node = client.get_node(node_name=asking[i])
                    if node is None:
                        host, port = asking[i].rsplit(":", 1)
                        node = client.nodes_manager.get_node(host=host, port=int(port))
                    if node is None:  # unknown node: refresh and route by slot again
                        client.nodes_manager.initialize()
                        node = client.nodes_manager.get_node_from_slot(client.keyslot(slot_keys[i]))
                else:
                    node = client.nodes_manager.get_node_from_slot(client.keyslot(slot_keys[i]))
                groups.setdefault(node.name, []).append(i)
                nodes[node.name] = node
            for name, indices in groups.items():
                redis_node = client.get_redis_connection(nodes[name])
                payload = b"".join((b"*1\r\n$6\r\nASKING\r\n" + packed[i]) if i in asking else packed[i]
                                   for i in indices)
                expected = len(indices) + sum(1 for i in indices if i in asking)
                got = _exchange(redis_node.connection_pool, payload, expected)
                position = 0
                for i in indices:
                    if i in asking:
                        position += 1  # ASKING's +OK
                    replies[i] = got[position]
                    position += 1
            asking = {}
            moved = False
            todo = []
            for i, reply in enumerate(replies):
                if isinstance(reply, AskError) and not isinstance(reply, MovedError):
                    asking[i] = f"{reply.host}:{reply.port}"
                    todo.append(i)
                elif isinstance(reply, MovedError):
                    moved = True
                    todo.append(i)
            if not todo:
                return replies
            if moved:
                client.nodes_manager.initialize()
        return replies  # still redirected: the pipeline classifies MOVED/ASK as retriable
