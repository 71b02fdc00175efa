"""Reads whole topics and counts, per key, the records that arrived out of order: a record whose
source version is below one an earlier record of the same key carried (in offset order within
its partition; a key lives in one partition). A record equal to the key's newest so far is a
duplicate (the same change sent twice), counted apart. Tombstones (a key's value None) carry no
version and are skipped, as are truncates.

One exception is counted apart too: a change below a snapshot row's version (``replayed``). A
snapshot taken again after one that did not finish streams from the first one's position
(snapshot/coordinator.py, "Handover"), so the changes in between follow the new snapshot's rows
with lower versions; the newest record of each key is still the newest state. Only a record
that follows a snapshot row (op ``r``) counts so."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from cdc.log.base import Log


@dataclass
class Order:
    records: int = 0
    duplicates: int = 0
    replayed: int = 0   # changes below a snapshot row's version, after it (the re-snapshot handover)
    out_of_order: list[tuple[str, int, int, int, int]] = field(default_factory=list)  # key, partition, offset, version, newest
    keys_in_two_partitions: list[str] = field(default_factory=list)


def topic_order(log: Log, topic: str) -> Order:
    found = Order()
    newest: dict[bytes, tuple[int, int, bool]] = {}   # key -> (partition, newest version, from a snapshot)
    for record in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)):
        if record.value is None or record.key is None:
            continue
        value = orjson.loads(record.value)
        if value["op"] == "t":
            continue
        found.records += 1
        version = value["source"]["version"]
        seen = newest.get(record.key)
        snapshot = value["op"] == "r"
        if seen is None:
            newest[record.key] = (record.partition, version, snapshot)
            continue
        partition, before, after_snapshot = seen
        if partition != record.partition:
            found.keys_in_two_partitions.append(record.key.decode(errors="replace"))
        if version < before and after_snapshot and not snapshot:
            found.replayed += 1
        elif version < before:
            found.out_of_order.append((record.key.decode(errors="replace"), record.partition, record.offset,
                                       version, before))
        elif version == before:
            found.duplicates += 1
        else:
            newest[record.key] = (record.partition, version, snapshot)
    return found
