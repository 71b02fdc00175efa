"""Key -> partition, the same way Kafka's Java client does it (murmur2), so every producer agrees.

librdkafka's ``murmur2_random`` partitioner computes the same function; the embedded log uses this
one, so a key lands in the same partition number on either log. In C where cdc/_records.c is built
(tests/unit/test_partitioner.py compares the two).
"""

from __future__ import annotations

from cdc import native

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c), as an unsigned 32-bit value."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's ``toPositive(murmur2(key)) % partitions``."""
    if _records is not None and native.enabled():
        return _records.partition_for(key, partitions)
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_records = native.load("cdc._records")
