"""The common row messages of one relation, decoded by code compiled for that relation.

Most of a stream is Insert, Update and Delete messages of a few tables, every value sent as text
(``t``) or NULL (``n``). The generic path (``pgoutput.PgOutputDecoder`` then ``ChangeBuilder``)
loops over the columns twice, dispatches on each column's kind, makes a tuple of texts and
then the key and the row from it through one converter call per value: about 6 us per change on
the benchmark's rows (bench/pg_stream.py). Like the MySQL source's row decoders, this writes,
once per Relation message, a Python function whose body is the straight-line reading of exactly
that relation's tuple: one block per column, the column's conversion inline for the common
types, the key and row dicts built from literals and the change event made in the same function.

It only ever takes the plain case and hands everything else back (returns ``None``) to the
generic path, which then does what it always did, errors included:

* Insert with a new tuple; Update with only a new tuple (no old key or old row: the key did not
  change and the replica identity is not FULL); Delete with the old key (``K``);
* every column ``t`` or ``n`` (an unchanged TOAST value ``u`` or a binary value goes back);
* no value that the TOAST store must remember (a text of ``MIN_TOASTABLE_CHARS`` bytes or more
  in a column that can be stored out of line goes back; bytes >= characters, so nothing that
  the generic path would remember stays here);
* anything malformed or any converter failing: back, and the generic path raises its typed
  error naming the message and the offset.

The events it makes are the generic path's, field for field; tests/unit/test_pg_fastpath.py
compares the two on the same payloads.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import orjson

from cdc.events import ChangeEvent, Op, SnapshotMarker, TransactionInfo
from sources.postgres.toast import MIN_TOASTABLE_CHARS
from sources.postgres.types.scalars import as_text, timestamp_to_iso, timestamptz_to_iso

RowPath = Callable[[bytes, int, Any], "list[ChangeEvent] | None"]

_HEAD = '''
def {name}(p, lsn, b):
    if p[5] != {kind} or p[6] << 8 | p[7] != {ncols}:
        return None
    pos = 8
{columns}
    if pos != len(p):
        return None
    key = {{{key}}}
{row}
    xid = b.xid
    if xid is None:
        tx = None
    else:
        b.order = order = b.order + 1
        table_order = b.table_order
        n = table_order[OID] = table_order.get(OID, 0) + 1
        tx = NEW(TX, (b.xid_text, order, n))
{tail}
'''

_TAILS = {
    "insert": "    return [NEW(EVENT, (CREATE, TABLE, key, None, row, lsn, b.commit_ms, STREAMED, "
              "{'txId': xid, 'lsn': lsn}, tx))]",
    "update": "    return [NEW(EVENT, (UPDATE, TABLE, key, None, row, lsn, b.commit_ms, STREAMED, "
              "{'txId': xid, 'lsn': lsn}, tx))]",
    "delete": "    b.toast.forget_key(QUALIFIED, DUMPS(key), list(NAMES))\n"
              "    return [NEW(EVENT, (DELETE, TABLE, key, dict(key), None, lsn, b.commit_ms, STREAMED, "
              "{'txId': xid, 'lsn': lsn}, tx))]",
}


def _column(i: int, convert: Callable[[str], Any], toastable: bool, env: dict[str, Any]) -> list[str]:
    """The block reading column ``i``: ``v<i>`` is its value, ``pos`` moves past it."""
    text = "p[s:pos].decode()"
    if convert is int:
        value = [f"v{i} = int(p[s:pos])"]  # ASCII digits: int() reads the bytes as they are
    elif convert is as_text:
        value = [f"v{i} = {text}"]
    elif convert is timestamptz_to_iso:
        value = [f"x = {text}",
                 f"v{i} = x[:-3].replace(' ', 'T', 1) + 'Z' if x[-3:] == '+00' else TSTZ(x)"]
    elif convert is timestamp_to_iso:
        value = [f"x = {text}",
                 f"v{i} = x if x[-1] == 'C' else x.replace(' ', 'T', 1)"]
    else:
        env[f"C{i}"] = convert
        value = [f"v{i} = C{i}({text})"]
    lines = ["k = p[pos]",
             "if k == 116:",
             "    s = pos + 5",
             "    pos = s + U32(p, pos + 1)[0]"]
    if toastable:
        lines.append(f"    if pos - s >= {MIN_TOASTABLE_CHARS}:")
        lines.append("        return None")
    lines += ["    " + line for line in value]
    lines += ["elif k == 110:",
              f"    v{i} = None",
              "    pos += 1",
              "else:",
              "    return None"]
    return lines


def compile_row_paths(oid: int, table: Any, qualified: str, names: tuple[str, ...],
                      converters: tuple[Callable[[str], Any], ...], key_index: tuple[int, ...],
                      toastable: tuple[int, ...]) -> dict[bytes, RowPath]:
    """The fast paths of one relation, by the first five bytes of the message they take (the
    type byte and the relation OID)."""
    env: dict[str, Any] = {
        "NEW": tuple.__new__, "EVENT": ChangeEvent, "TX": TransactionInfo, "CREATE": Op.CREATE,
        "UPDATE": Op.UPDATE, "DELETE": Op.DELETE, "STREAMED": SnapshotMarker.FALSE,
        "U32": struct.Struct("!I").unpack_from, "TSTZ": timestamptz_to_iso, "DUMPS": orjson.dumps,
        "OID": oid, "TABLE": table, "QUALIFIED": qualified, "NAMES": names,
    }
    toast = set(toastable)
    columns: list[str] = []
    for i, convert in enumerate(converters):
        columns += _column(i, convert, i in toast, env)
    body = "\n".join("    " + line for line in columns)
    key = ", ".join(f"{names[i]!r}: v{i}" for i in key_index)
    row = "    row = {" + ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names)) + "}"
    source = "\n".join(
        _HEAD.format(name=kind, kind=tuple_kind, ncols=len(names), columns=body, key=key,
                     row=row if kind != "delete" else "", tail=_TAILS[kind])
        for kind, tuple_kind in (("insert", 78), ("update", 78), ("delete", 75)))
    exec(compile(source, f"<row paths of {qualified}>", "exec"), env)  # noqa: S102 - our own code
    prefix = struct.pack("!I", oid)
    return {b"I" + prefix: env["insert"], b"U" + prefix: env["update"], b"D" + prefix: env["delete"]}
