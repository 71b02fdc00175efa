"""The snapshot's row JSON from COPY text: sources/postgres/_copyjson.c against its Python twin
(``CopyJson.rewrite_lines``, the reference). For any block, the C function makes the same bytes,
or refuses it (None) where the twin raises a DecodeError. What both make is checked against the
server itself in tests/integration/test_pg_copy_json.py."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc import native
from cdc.errors import DecodeError
from sources.postgres import copy_json
from sources.postgres.copy_json import CopyJson, copy_escape
from sources.postgres.types.server_json import BOOL, BYTEA, FLOAT, RAW, STRING, TIMESTAMP, TIMESTAMPTZ


def test_the_c_function_is_built():
    if os.environ.get("CDC_ALLOW_NO_SPEEDUPS") == "1" or not native.ALLOWED:
        return
    assert copy_json._copyjson is not None, "sources.postgres._copyjson was not built: pip install -e ."


needs_c = pytest.mark.skipif(copy_json._copyjson is None, reason="_copyjson not built (see the test above)")

KINDS = [RAW, FLOAT, BOOL, STRING, TIMESTAMP, TIMESTAMPTZ, BYTEA]
SPEC = CopyJson.of("public.t", ["id", 'we"ird\\name', "f", "b", "s", "ts", "tstz", "raw"],
                   [RAW, STRING, FLOAT, BOOL, STRING, TIMESTAMP, TIMESTAMPTZ, BYTEA],
                   keys=[0, 4], toast=[1, 4, 7], min_chars=5)


def _c(spec: CopyJson, block: bytes):
    return copy_json._copyjson.rewrite(block, spec.kinds, spec.heads, spec.keys, spec.toast, spec.min_chars)


@needs_c
def test_under_the_reference_switch_the_server_makes_the_row_json():
    def plan():
        return CopyJson.for_table("public.t", [("id", 23)], {}, [0], [], 5)
    assert plan() is not None
    with native.reference():
        assert plan() is None


def test_a_line_becomes_the_statements_line():
    line = ("42\ttab\\there\t-1.5e+300\tt\tq\"\\\\é\x01\t2024-01-02 03:04:05\t2024-01-02 03:04:05.5+00\t"
            "\\\\x0001ff\n").encode()
    want = ('42\tq"\\\\é\x01\t{"id":42,"we\\\\"ird\\\\\\\\name":"tab\\\\there","f":-1.5e+300,"b":true,'
            '"s":"q\\\\"\\\\\\\\é\\\\u0001","ts":"2024-01-02T03:04:05","tstz":"2024-01-02T03:04:05.5Z",'
            '"raw":"AAH/"}\ttab\\there\tq"\\\\é\x01\t\\\\x0001ff\n').encode()
    assert SPEC.rewrite_lines(line) == want
    if copy_json._copyjson is not None:
        assert _c(SPEC, line) == want


def test_nulls_edge_values_and_short_values():
    line = b"\\N\t\\N\tNaN\tf\tabc\t0044-03-15 12:00:00 BC\t0044-03-15 12:00:00+00 BC\t\\N\n"
    want = (b'\\N\tabc\t{"id":null,"we\\\\"ird\\\\\\\\name":null,"f":"NaN","b":false,"s":"abc",'
            b'"ts":"0044-03-15 12:00:00 BC","tstz":"0044-03-15 12:00:00+00 BC","raw":null}\t\t\t\n')
    assert SPEC.rewrite_lines(line) == want
    if copy_json._copyjson is not None:
        assert _c(SPEC, line) == want


@pytest.mark.parametrize("line", [
    b"1\ta\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\n",  # a field short
    b"1\ta\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\x00\textra\n",
    b"1\ta\t1\tyes\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\x00\n",  # not a bool
    b"1\ta\\q\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\x00\n",  # an escape never written
    b"1\ta\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\x0\n",  # odd hex
    b"1\ta\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\xzz\n",
    b"\t\ta\t1\tt\ts\t2024-01-01 00:00:00\t2024-01-01 00:00:00+00\t\\\\x00\n",
    b"",
])
def test_bad_lines_are_refused_by_c_and_named_by_the_twin(line):
    if line:
        with pytest.raises(DecodeError, match="public.t: COPY line 1"):
            SPEC.rewrite_lines(line)
        if copy_json._copyjson is not None:
            assert _c(SPEC, line) is None
            with pytest.raises(DecodeError):
                SPEC(line)
    else:
        assert SPEC.rewrite_lines(line) == b"" == SPEC(line)


_texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_fields = {
    RAW: st.one_of(st.integers(-2**63, 2**63 - 1).map(str), st.sampled_from(["", "1\\n"])),
    FLOAT: st.one_of(st.floats(allow_nan=False).map(repr), st.sampled_from(
        ["NaN", "Infinity", "-Infinity", "-0", "1e+300", "1.", ".5", "01", "1e", "-", "1E-5", "1.5e+30x"])),
    BOOL: st.sampled_from(["t", "f", "x", "true"]),
    STRING: _texts.map(copy_escape),
    TIMESTAMP: st.sampled_from(["2024-01-02 03:04:05", "infinity", "0044-03-15 12:00:00 BC", "a b c", "x\\\\"]),
    TIMESTAMPTZ: st.sampled_from(["2024-01-02 03:04:05+00", "2024-01-02 03:04:05+05:30", "-infinity",
                                  "0044-03-15 12:00:00+00 BC", "+00", ""]),
    BYTEA: st.one_of(st.binary(max_size=20).map(lambda b: "\\\\x" + b.hex()), st.sampled_from(["\\\\x1", "x00"])),
}


@st.composite
def _blocks(draw):
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    names = draw(st.lists(_texts, min_size=len(kinds), max_size=len(kinds)))
    keys = draw(st.lists(st.integers(0, len(kinds) - 1), max_size=2, unique=True))
    toast = draw(st.lists(st.integers(0, len(kinds) - 1), max_size=3, unique=True))
    spec = CopyJson.of("public.t", names, kinds, keys, toast, draw(st.integers(0, 8)))
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        fields = [draw(st.one_of(st.just("\\N"), _fields[kind])) for kind in kinds]
        lines.append("\t".join(fields) + "\n")
    return spec, "".join(lines).encode()


@needs_c
@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(_blocks())
def test_c_and_the_twin_agree(case):
    spec, block = case
    made = _c(spec, block)
    if made is None:
        with pytest.raises(DecodeError):
            spec.rewrite_lines(block)
    else:
        assert made == spec.rewrite_lines(block)


def _int_key_plan():
    from cdc.events import TableId
    from sources.postgres.catalog import ColumnMeta, TableMeta
    from sources.postgres.snapshot import Chunk, SnapshotRows
    from sources.postgres.types import converter_for

    meta = TableMeta(1, TableId("db", "public", "t"), (ColumnMeta("id", 20, "bigint", True),
                                                        ColumnMeta("note", 25, "text", False)), ("id",), "d")
    rows = SnapshotRows(7, 1, lambda oids: [converter_for(o, {}) for o in oids], None, batch=100)
    return rows.plan(Chunk(meta, None, None))


def _comparable(events):
    import orjson

    return [(e.op, e.table, e.key, e.before, orjson.dumps(e.after), e.version, e.ts_ms, e.snapshot, e.source_fields,
             e.transaction) for e in events]


@needs_c
@pytest.mark.parametrize("block, taken", [
    (b'1\t{"id":1,"note":"a"}\t\n-42\t{"id":-42,"note":null}\t\n9223372036854775807\t{"id":9223372036854775807}\t\n',
     True),
    (b'1\t{"id":1,"note":"a\\\\tb"}\t\n', False),         # an escape: line by line
    (b'1\t{"id":1,"note":"' + b"x" * 500 + b'"}\t\n', False),  # long enough to be remembered for TOAST
    (b'-9223372036854775808\t{"id":-9223372036854775808}\t\n', False),  # 20 characters: build_batch's int()
    (b'+1\t{"id":1}\t\n', False),
])
def test_int_key_events_are_build_batchs(block, taken):
    """The C events of a block (``block_events``) equal the line-by-line builder's, field for field."""
    plan = _int_key_plan()
    assert plan.block_events is not None
    made = plan.block_events(block)
    by_lines = [plan.build(line) for line in block.split(b"\n")[:-1]]
    if taken:
        assert _comparable(made) == _comparable(by_lines)
        assert type(made[0]) is type(by_lines[0])
    else:
        assert made is None
        assert _comparable(plan.events(block)) == _comparable(by_lines)
