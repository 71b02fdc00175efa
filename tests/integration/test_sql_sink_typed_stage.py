"""PostgreSQL upserts staged as typed COPY rows (sinks/sql/copy_rows.py) against a real server:
values COPY must escape land intact, every type family lands as the jsonb staging landed it, and
the version guard and remembered deletes hold under shuffled, repeated replays."""

from __future__ import annotations

import random

import pytest

from cdc.events import Op
from tests.unit.test_sql_sink import Sinks, delete, rows, schema_record, tombstone, upsert

pytestmark = pytest.mark.postgres

AWKWARD = ["tab\there", "new\nline", "cr\rhere", "back\\slash", "\\N", "\\.", "ends with \\", "é ✓ 😀",
           "\u2028line separator", "", " ", "'quoted' \"double\"", "\x01control\x1f", "%s %(x)s"]

COLUMNS = [("id", "bigint"), ("t", "text"), ("n", "numeric(12,3)"), ("f", "double precision"),
           ("b", "boolean"), ("ts", "timestamp with time zone"), ("d", "date"), ("j", "jsonb"),
           ("bin", "bytea"), ("u", "uuid"), ("i", "integer")]


def _row(i: int) -> dict:
    return {"t": AWKWARD[i % len(AWKWARD)], "n": f"{i}.125", "f": [1.5, "NaN", "Infinity", -0.25][i % 4],
            "b": i % 2 == 0, "ts": f"2024-03-0{1 + i % 9}T10:00:00.{i % 1000:03d}Z", "d": "2024-02-29",
            "j": [{"k": AWKWARD[(i + 3) % len(AWKWARD)], "n": [i, None]}, None, "plain", 7][i % 4],
            "bin": "AAEC/w==", "u": "123e4567-e89b-12d3-a456-426614174000", "i": None if i % 3 else i}


@pytest.fixture
def sinks(pg_dsn):
    made = Sinks(pg_dsn.replace("postgresql://", "postgresql+psycopg2://", 1))
    made.records["shop.public.orders"] = schema_record(COLUMNS)
    yield made
    made.stop()


def _write_both(sinks, events):
    """The same events through the typed staging (s1) and the jsonb staging (s2, its own schema)."""
    typed = sinks(name="s1")
    jsonb = sinks(name="s2", schema="jsonb_stage")
    jsonb.applier.typed_upserts = False
    assert typed.applier.typed_upserts
    typed.write(events)
    jsonb.write(events)
    return typed, jsonb


def test_awkward_values_and_every_family_land_as_the_jsonb_staging_landed_them(sinks):
    events = [upsert(i, 10 + i, op=Op.CREATE, **_row(i)) for i in range(len(AWKWARD) * 2)]
    typed, jsonb = _write_both(sinks, events)
    as_text = ", ".join(f"{name}::text" for name, _ in COLUMNS) + ", __cdc_version"
    got = rows(typed, as_text, order="__cdc_version")
    assert got == rows(jsonb, as_text, table="jsonb_stage.orders", order="__cdc_version")
    assert [r[1] for r in got] == [AWKWARD[i % len(AWKWARD)] for i in range(len(AWKWARD) * 2)]
    assert got[0][8] == "\\x000102ff" and got[1][7] is None  # bytea decoded; JSON null -> NULL
    assert [r[3] for r in got[:4]] == ["1.5", "NaN", "Infinity", "-0.25"]


def test_a_value_that_does_not_fit_fails_naming_table_key_and_column(sinks):
    typed = sinks(name="s1")
    typed.write([upsert(1, 10, **_row(1))])
    with pytest.raises(Exception, match=r"key \{\"id\":2\}: column n"):
        typed.write([upsert(2, 11, **{**_row(2), "n": "not a number"})])


def test_shuffled_repeated_replays_never_regress_and_remembered_deletes_hold(sinks):
    rng = random.Random(18)
    history, newest = [], {}
    version = 100
    for _ in range(600):
        key = rng.randrange(40)
        version += 1
        if rng.random() < 0.2:
            history.append(delete(key, version))
            newest[key] = None
        else:
            history.append(upsert(key, version, t=f"v{version}\t{key}", i=version))
            newest[key] = version
    typed = sinks(name="s1")
    typed.write(history)  # in order, in one batch (reduced to the newest per key)
    for _ in range(5):  # replays: shuffled, in batches, some repeated
        replay = history[:]
        rng.shuffle(replay)
        for start in range(0, len(replay), 37):
            typed.write(replay[start:start + 37])
    expected = sorted((key, version, f"v{version}\t{key}") for key, version in newest.items() if version is not None)
    assert rows(typed, "id, __cdc_version, t") == expected
    typed.write([tombstone(k) for k in range(40)])
    assert rows(typed, "id") == []
    typed.write(history)  # a replay after the tombstones: only keys whose newest change is an upsert
    assert rows(typed, "id, __cdc_version, t") == expected
