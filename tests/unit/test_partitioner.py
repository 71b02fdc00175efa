from hypothesis import given, settings
from hypothesis import strategies as st

from cdc import native
from cdc.log.partitioner import murmur2, partition_for

_records = native.load("cdc._records")


def test_murmur2_matches_kafkas_java_client():
    # Reference values from Kafka's UtilsTest.testMurmur2 (signed 32-bit there).
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF, data


def test_partition_is_stable_and_in_range():
    keys = [f'{{"id": {i}}}'.encode() for i in range(1000)]
    parts = [partition_for(k, 6) for k in keys]
    assert parts == [partition_for(k, 6) for k in keys]
    assert set(parts) == set(range(6))


@settings(max_examples=500, deadline=None)
@given(key=st.binary(max_size=64), partitions=st.integers(1, 1000))
def test_the_c_partitioner_agrees_with_the_python_one(key, partitions):
    assert _records is not None, "cdc/_records.c is built by scripts/setup"
    with native.reference():
        expected = partition_for(key, partitions)
    assert _records.partition_for(key, partitions) == expected == (murmur2(key) & 0x7FFFFFFF) % partitions
    assert partition_for(key, partitions) == expected
