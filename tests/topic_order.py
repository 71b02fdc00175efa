"""Reads whole topics and counts, per key, the records that arrived out of order: a record whose
source version is below one an earlier record of the same key carried (in offset order within
its partition; a key lives in one partition). A record equal to the key's newest so far is a
duplicate (the same change sent twice), counted apart. Tombstones (a key's value None) carry no
version and are skipped, as are truncates."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from cdc.log.base import Log


@dataclass
class Order:
    records: int = 0
    duplicates: int = 0
    out_of_order: list[tuple[str, int, int, int, int]] = field(default_factory=list)  # key, partition, offset, version, newest
    keys_in_two_partitions: list[str] = field(default_factory=list)


def topic_order(log: Log, topic: str) -> Order:
    found = Order()
    newest: dict[bytes, tuple[int, int]] = {}   # key -> (partition, newest version)
    for record in sorted(log.read_all(topic), key=lambda r: (r.partition, r.offset)):
        if record.value is None or record.key is None:
            continue
        value = orjson.loads(record.value)
        if value["op"] == "t":
            continue
        found.records += 1
        version = value["source"]["version"]
        seen = newest.get(record.key)
        if seen is None:
            newest[record.key] = (record.partition, version)
            continue
        partition, before = seen
        if partition != record.partition:
            found.keys_in_two_partitions.append(record.key.decode(errors="replace"))
        if version < before:
            found.out_of_order.append((record.key.decode(errors="replace"), record.partition, record.offset,
                                       version, before))
        elif version == before:
            found.duplicates += 1
        else:
            newest[record.key] = (record.partition, version)
    return found
