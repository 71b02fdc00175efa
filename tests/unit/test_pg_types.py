"""PostgreSQL text output -> JSON values: every converter branch on literal server texts, and
property tests that render values the way the server quotes them and read them back."""

from __future__ import annotations

import string
import threading

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc.errors import DecodeError
from sources.postgres.types import (
    BUILTIN_TYPES,
    SESSION_SETTINGS,
    TypeInfo,
    TypeKind,
    convert_row,
    converter_for,
    iter_copy_batches,
    iter_copy_rows,
    parse_copy_text_line,
    session_options,
)
from sources.postgres.types.hstore import hstore_to_dict

# Built-in OIDs used below.
BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, POINT, BOX, FLOAT4, FLOAT8, MONEY = 114, 142, 600, 603, 700, 701, 790
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, JSONB, INT2VECTOR = 1700, 2950, 3802, 22
INT4RANGE, NUMRANGE, TSTZRANGE, DATERANGE, INT4MULTIRANGE, TSMULTIRANGE = 3904, 3906, 3910, 3912, 4451, 4533
ARRAY_OF = {INT4: 1007, TEXT: 1009, BOX: 1020, FLOAT8: 1022, BYTEA: 1001, TIMESTAMPTZ: 1185,
            JSONB: 3807, INT4RANGE: 3905, DATE: 1182, NUMERIC: 1231}

# A user-defined catalog as load_type_catalog would return it (OIDs above 16384 are the server's).
HSTORE, HSTORE_ARRAY, MOOD, MOOD_ARRAY, POSINT, POSINT_ARRAY, TAGS, PAIR, TEXTRANGE, TEXTMULTIRANGE = (
    16464, 16469, 20001, 20002, 20003, 20004, 20005, 20006, 20007, 20008)
CATALOG = {
    HSTORE: TypeInfo(HSTORE, "hstore", TypeKind.BASE, schema="public"),
    HSTORE_ARRAY: TypeInfo(HSTORE_ARRAY, "_hstore", TypeKind.ARRAY, element_oid=HSTORE, schema="public"),
    MOOD: TypeInfo(MOOD, "mood", TypeKind.ENUM, schema="public"),
    MOOD_ARRAY: TypeInfo(MOOD_ARRAY, "_mood", TypeKind.ARRAY, element_oid=MOOD, schema="public"),
    POSINT: TypeInfo(POSINT, "posint", TypeKind.DOMAIN, base_oid=INT4, schema="public"),
    POSINT_ARRAY: TypeInfo(POSINT_ARRAY, "_posint", TypeKind.ARRAY, element_oid=POSINT, schema="public"),
    TAGS: TypeInfo(TAGS, "tags", TypeKind.DOMAIN, base_oid=ARRAY_OF[TEXT], schema="public"),
    PAIR: TypeInfo(PAIR, "pair", TypeKind.COMPOSITE, schema="public"),
    TEXTRANGE: TypeInfo(TEXTRANGE, "textrange", TypeKind.RANGE, range_subtype_oid=TEXT, schema="public"),
    TEXTMULTIRANGE: TypeInfo(TEXTMULTIRANGE, "textmultirange", TypeKind.MULTIRANGE, element_oid=TEXTRANGE,
                             range_subtype_oid=TEXT, schema="public"),
}


def conv(oid: int, text: str):
    return converter_for(oid, CATALOG)(text)


# --- session ----------------------------------------------------------------------------------

def test_session_options_render_every_setting_and_escape_spaces():
    options = session_options()
    assert options == ("-c TimeZone=UTC -c DateStyle=ISO,\\ MDY -c IntervalStyle=iso_8601 "
                       "-c extra_float_digits=3 -c bytea_output=hex -c lc_monetary=C")
    assert options.count("-c ") == len(SESSION_SETTINGS)
    assert session_options("-c search_path=app").startswith("-c search_path=app -c TimeZone=UTC")


# --- scalars ----------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text, expected", [
    (INT2, "-32768", -32768), (INT4, "42", 42), (INT8, "9223372036854775807", 9223372036854775807),
    (OID, "4294967295", 4294967295),
    (NUMERIC, "12.50", "12.50"), (NUMERIC, "NaN", "NaN"), (NUMERIC, "Infinity", "Infinity"),
    (NUMERIC, "-Infinity", "-Infinity"), (NUMERIC, "-0.000001", "-0.000001"),
    (FLOAT8, "1.5", 1.5), (FLOAT8, "1e+300", 1e300), (FLOAT8, "-0", -0.0), (FLOAT4, "0.1", 0.1),
    (FLOAT8, "1.5e-310", 1.5e-310),
    (FLOAT8, "NaN", "NaN"), (FLOAT8, "Infinity", "Infinity"), (FLOAT4, "-Infinity", "-Infinity"),
    (BOOL, "t", True), (BOOL, "f", False),
    (TEXT, "", ""), (TEXT, "naïve \t\n 🎉", "naïve \t\n 🎉"), (VARCHAR, "v", "v"),
    (BPCHAR, "abc  ", "abc  "), (NAME, "nm", "nm"), (CHAR, "x", "x"),
    (BYTEA, "\\x", ""), (BYTEA, "\\x00ff", "AP8="), (BYTEA, "\\x000102", "AAEC"),
    (BYTEA, "a\\\\b\\000", "YVxiAA=="),  # bytea_output=escape, should a session ever use it
    (DATE, "2024-02-29", "2024-02-29"), (DATE, "0044-03-15 BC", "0044-03-15 BC"),
    (DATE, "infinity", "infinity"), (DATE, "-infinity", "-infinity"),
    (TIME, "03:04:05", "03:04:05"), (TIME, "24:00:00", "24:00:00"), (TIME, "03:04:05.5", "03:04:05.5"),
    (TIMETZ, "10:00:00.25+02", "10:00:00.25+02"),
    (TIMESTAMP, "2024-01-02 03:04:05", "2024-01-02T03:04:05"),
    (TIMESTAMP, "2024-01-02 03:04:05.123456", "2024-01-02T03:04:05.123456"),
    (TIMESTAMP, "0044-03-15 12:00:00 BC", "0044-03-15 12:00:00 BC"),
    (TIMESTAMP, "infinity", "infinity"), (TIMESTAMP, "-infinity", "-infinity"),
    (TIMESTAMPTZ, "2024-01-02 03:04:05.123456+00", "2024-01-02T03:04:05.123456Z"),
    (TIMESTAMPTZ, "2024-01-02 03:04:05+00", "2024-01-02T03:04:05Z"),
    (TIMESTAMPTZ, "10000-01-01 00:00:00+00", "10000-01-01T00:00:00Z"),
    (TIMESTAMPTZ, "0044-03-15 12:00:00+00 BC", "0044-03-15 12:00:00+00 BC"),
    (TIMESTAMPTZ, "infinity", "infinity"), (TIMESTAMPTZ, "-infinity", "-infinity"),
    (INTERVAL, "P1Y2M3DT4H5M6.7S", "P1Y2M3DT4H5M6.7S"), (INTERVAL, "P-1D", "P-1D"), (INTERVAL, "PT0S", "PT0S"),
    (UUID, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    (MONEY, "-$1,234.50", "-$1,234.50"), (869, "10.0.0.1/8", "10.0.0.1/8"), (650, "10.0.0.0/8", "10.0.0.0/8"),
    (829, "08:00:2b:01:02:03", "08:00:2b:01:02:03"), (774, "08:00:2b:01:02:03:04:05", "08:00:2b:01:02:03:04:05"),
    (1560, "101", "101"), (1562, "1010", "1010"), (XML, "<a>x</a>", "<a>x</a>"),
    (3614, "'a' 'b'", "'a' 'b'"), (POINT, "(1,2)", "(1,2)"), (BOX, "(1,1),(0,0)", "(1,1),(0,0)"),
    (718, "<(0,0),1>", "<(0,0),1>"), (3220, "0/16B3748", "0/16B3748"), (INT2VECTOR, "1 2", "1 2"),
    (99999, "anything (unknown type)", "anything (unknown type)"),
])
def test_scalar(oid, text, expected):
    value = conv(oid, text)
    assert value == expected and type(value) is type(expected)


def test_negative_zero_float_keeps_its_sign():
    assert orjson.dumps(conv(FLOAT8, "-0")) == b"-0.0"


def test_timestamptz_outside_utc_is_refused_not_passed_on():
    with pytest.raises(ValueError, match="TimeZone=UTC"):
        conv(TIMESTAMPTZ, "2024-01-02 03:04:05+02")


@pytest.mark.parametrize("oid", [JSON, JSONB])
def test_json_nested(oid):
    assert conv(oid, '{"a": [1, 2.50, null, true], "b": {"c": "é"}}') == \
        {"a": [1, 2.5, None, True], "b": {"c": "é"}}
    assert conv(oid, '"x"') == "x" and conv(oid, "null") is None


def test_json_numbers_beyond_double_range_are_kept_as_text():
    huge = "1" + "0" * 400
    assert conv(JSONB, f'{{"n": {huge}, "f": 1e400, "ok": 1.5, "i": 7}}') == \
        {"n": huge, "f": "1e400", "ok": 1.5, "i": 7}


def test_invalid_json_raises_value_error():
    with pytest.raises(ValueError):
        conv(JSON, "{")


# --- catalog kinds ----------------------------------------------------------------------------

def test_enum_domain_composite_and_hstore_by_kind():
    assert conv(MOOD, "happy") == "happy"
    assert conv(POSINT, "7") == 7
    assert conv(PAIR, '(1,"a b",)') == '(1,"a b",)'
    assert conv(TAGS, '{a,"b c"}') == ["a", "b c"]
    assert conv(POSINT_ARRAY, "{1,NULL,3}") == [1, None, 3]
    assert conv(MOOD_ARRAY, "{sad,happy}") == ["sad", "happy"]
    assert conv(HSTORE, '"a"=>"1"') == {"a": "1"}
    assert conv(HSTORE_ARRAY, '{"\\"a\\"=>\\"1\\"","\\"b\\"=>NULL",NULL}') == [{"a": "1"}, {"b": None}, None]


def test_builtin_catalog_covers_arrays_ranges_and_multiranges():
    assert BUILTIN_TYPES[1007] == TypeInfo(1007, "_int4", TypeKind.ARRAY, element_oid=INT4)
    assert BUILTIN_TYPES[1020].delimiter == ";"
    assert BUILTIN_TYPES[TSTZRANGE].range_subtype_oid == TIMESTAMPTZ
    assert BUILTIN_TYPES[TSMULTIRANGE] == TypeInfo(TSMULTIRANGE, "tsmultirange", TypeKind.MULTIRANGE,
                                                   element_oid=3908, range_subtype_oid=TIMESTAMP)


def test_text_like_types_convert_with_str_itself():
    # Callers may skip identity conversions by checking ``converter is str``.
    for oid in (TEXT, VARCHAR, NUMERIC, DATE, UUID, MOOD, PAIR, 99999):
        assert converter_for(oid, CATALOG) is str


# --- arrays -----------------------------------------------------------------------------------

@pytest.mark.parametrize("oid, text, expected", [
    (ARRAY_OF[INT4], "{1,2,NULL}", [1, 2, None]),
    (ARRAY_OF[INT4], "{}", []),
    (ARRAY_OF[INT4], "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (ARRAY_OF[INT4], "{{{1},{2}},{{3},{NULL}}}", [[[1], [2]], [[3], [None]]]),
    (ARRAY_OF[INT4], "[0:2]={1,2,3}", [1, 2, 3]),
    (ARRAY_OF[INT4], "[-1:0][1:2]={{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (ARRAY_OF[INT4], "{ 1 , 2 }", [1, 2]),  # array_in's white space, never array_out's
    (ARRAY_OF[TEXT], '{a,"","NULL",NULL,"with \\"q\\"","back\\\\slash","x,y","{b}"," sp",é}',
     ["a", "", "NULL", None, 'with "q"', "back\\slash", "x,y", "{b}", " sp", "é"]),
    (ARRAY_OF[TEXT], '{null,"null",Null}', [None, "null", None]),
    (ARRAY_OF[TEXT], '{{"a b",c},{NULL,"}"}}', [["a b", "c"], [None, "}"]]),
    (ARRAY_OF[TEXT], '{a\\,b,c}', ["a,b", "c"]),  # array_in reads escapes outside quotes too
    (ARRAY_OF[TEXT], '{"line\nbreak","tab\there"}', ["line\nbreak", "tab\there"]),
    (ARRAY_OF[BOX], "{(1,1),(0,0);(3,3),(2,2)}", ["(1,1),(0,0)", "(3,3),(2,2)"]),
    (ARRAY_OF[FLOAT8], "{1.5,NaN,Infinity,-Infinity}", [1.5, "NaN", "Infinity", "-Infinity"]),
    (ARRAY_OF[BYTEA], '{"\\\\x00","\\\\xff",NULL}', ["AA==", "/w==", None]),
    (ARRAY_OF[TIMESTAMPTZ], '{"2024-01-02 03:04:05+00",infinity}', ["2024-01-02T03:04:05Z", "infinity"]),
    (ARRAY_OF[JSONB], '{"{\\"a\\": 1}","\\"x\\"",null}', [{"a": 1}, "x", None]),
    (ARRAY_OF[INT4RANGE], '{"[1,3)",empty}', [{"lower": 1, "upper": 3, "lower_inc": True, "upper_inc": False},
                                              "empty"]),
    (ARRAY_OF[NUMERIC], "{1.50,NaN}", ["1.50", "NaN"]),
])
def test_array(oid, text, expected):
    assert conv(oid, text) == expected


@pytest.mark.parametrize("text", ["", "{1,2", "{1,2}}", "{1}{2}", "1,2", "[0:1]{1,2}", '{"a}', "{a\\}"])
def test_malformed_array_raises_decode_error(text):
    with pytest.raises(DecodeError):
        conv(ARRAY_OF[TEXT], text)


# --- ranges -----------------------------------------------------------------------------------

def _range(lower, upper, lower_inc, upper_inc):
    return {"lower": lower, "upper": upper, "lower_inc": lower_inc, "upper_inc": upper_inc}


@pytest.mark.parametrize("oid, text, expected", [
    (INT4RANGE, "[1,3)", _range(1, 3, True, False)),
    (INT4RANGE, "empty", "empty"),
    (INT4RANGE, "(,6)", _range(None, 6, False, False)),
    (INT4RANGE, "[5,)", _range(5, None, True, False)),
    (INT4RANGE, "(,)", _range(None, None, False, False)),
    (NUMRANGE, "(,2.5]", _range(None, "2.5", False, True)),
    (DATERANGE, "[2024-01-01,infinity)", _range("2024-01-01", "infinity", True, False)),
    (TSTZRANGE, '["2024-01-01 00:00:00+00","2024-02-01 00:00:00.5+00")',
     _range("2024-01-01T00:00:00Z", "2024-02-01T00:00:00.5Z", True, False)),
    (TSTZRANGE, '[-infinity,"2024-02-01 00:00:00+00"]', _range("-infinity", "2024-02-01T00:00:00Z", True, True)),
    # text bounds: range_out doubles '"' and '\' inside quotes; "" is the empty string, not unbounded
    (TEXTRANGE, '["","a""b\\\\c"]', _range("", 'a"b\\c', True, True)),
    (TEXTRANGE, '("x,y","(z)")', _range("x,y", "(z)", False, False)),
    (TEXTRANGE, '[a\\,b,c"d e"f]', _range("a,b", "cd ef", True, True)),  # range_in's other forms
    (TEXTRANGE, '["\\"q",)', _range('"q', None, True, False)),
    (TEXTRANGE, "  EMPTY ", "empty"),
])
def test_range(oid, text, expected):
    assert conv(oid, text) == expected


@pytest.mark.parametrize("oid, text, expected", [
    (INT4MULTIRANGE, "{}", []),
    (INT4MULTIRANGE, "{[1,3),[5,7)}", [_range(1, 3, True, False), _range(5, 7, True, False)]),
    (INT4MULTIRANGE, "{[1,3), (,0), empty}", [_range(1, 3, True, False), _range(None, 0, False, False)]),
    (TSMULTIRANGE, '{["2024-01-01 00:00:00","2024-01-02 00:00:00")}',
     [_range("2024-01-01T00:00:00", "2024-01-02T00:00:00", True, False)]),
])
def test_multirange(oid, text, expected):
    assert conv(oid, text) == expected


@pytest.mark.parametrize("oid, text", [(INT4RANGE, "[1,3"), (INT4RANGE, "1,3"), (INT4RANGE, ""),
                                       (TEXTRANGE, '["a,b)'), (INT4MULTIRANGE, "[1,3)"),
                                       (INT4MULTIRANGE, "{[1,3)"), (INT4MULTIRANGE, "{[1,3),x}")])
def test_malformed_range_raises_decode_error(oid, text):
    with pytest.raises(DecodeError):
        conv(oid, text)


# --- hstore -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("   ", {}),
    ('"a"=>"1"', {"a": "1"}),
    ('"a"=>"1", "é"=>"ü", "b c"=>NULL, "q\\"x"=>"NULL", "bs\\\\\\\\"=>""',
     {"a": "1", "é": "ü", "b c": None, 'q"x': "NULL", "bs\\\\": ""}),
    ('"k"=>"a, b=>c"', {"k": "a, b=>c"}),
    ("a=>1,b=>null, c => \"x y\"", {"a": "1", "b": None, "c": "x y"}),  # hstore_in's bare forms
    ('a\\ b=>c\\"d', {"a b": 'c"d'}),
])
def test_hstore(text, expected):
    assert hstore_to_dict(text) == expected


@pytest.mark.parametrize("text", ['"a"=>', '"a"', '"a"=>"1" "b"=>"2"', '=>"1"', '"a=>"1"'])
def test_malformed_hstore_raises_decode_error(text):
    with pytest.raises(DecodeError):
        hstore_to_dict(text)


# --- rows -------------------------------------------------------------------------------------

def test_convert_row_passes_nulls_and_names_the_failing_column():
    columns = [("id", converter_for(INT4, {})), ("at", converter_for(TIMESTAMPTZ, {})),
               ("tags", converter_for(ARRAY_OF[TEXT], {}))]
    assert convert_row(columns, ["1", None, "{a}"]) == {"id": 1, "at": None, "tags": ["a"]}
    with pytest.raises(DecodeError, match="column at: cannot convert '2024-01-01 00:00:00\\+05'"):
        convert_row(columns, ["1", "2024-01-01 00:00:00+05", "{a}"])
    with pytest.raises(DecodeError, match="column tags"):
        convert_row(columns, ["1", None, "{a"])
    with pytest.raises(DecodeError, match="2 values for 3 columns"):
        convert_row(columns, ["1", None])


# --- COPY text --------------------------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    (b"1\ta\tb\n", ["1", "a", "b"]),
    (b"1\ta\tb", ["1", "a", "b"]),
    (b"\\N\t\t\\N\n", [None, "", None]),
    (b"\\\\N\t\\N", ["\\N", None]),                         # an escaped backslash, then N: the text
    (b"a\\tb\\nc\\rd\\\\e\\bf\\fg\\vh", ["a\tb\nc\rd\\e\bf\fg\vh"]),
    (b"\\q\\\xc3\xa9", ["q\u00e9"]),                         # backslash before any other char: that char
    (b"\\303\\251\t\\x41\\x4a\\7", ["\u00e9", "AJ\x07"]),   # octal and hex bytes, joined into UTF-8
    (b"\\xg", ["xg"]),                                       # \x without hex digits is an x
    (b"a\\\tb\tc", ["a\tb", "c"]),                           # backslash-tab: a tab inside the value
    (b"a\\\\\tb", ["a\\", "b"]),                             # escaped backslash, then a real separator
    ("naïve 🎉\t".encode(), ["naïve 🎉", ""]),
])
def test_parse_copy_text_line(line, expected):
    assert parse_copy_text_line(line) == expected


@pytest.mark.parametrize("line", [b"a\t\xff", b"abc\\", b"\\303"])
def test_bad_copy_lines_raise_decode_error(line):
    with pytest.raises(DecodeError):
        parse_copy_text_line(line)


# --- properties: render as the server does, read back -----------------------------------------

_PG_SPACE = " \t\n\r\v\f"  # isspace() in the C locale, which array_out and range_out use
# \u00a0 and \u2003 are white space to Python but not to the server's isspace(): never stripped.
tricky_text = st.text(alphabet=st.sampled_from(list('"\\,{}()[]; \t\nNULnul=>xé🎉\x01\u00a0\u2003')
                                               + list(string.ascii_letters)),
                      max_size=12) | st.sampled_from(["NULL", "null", "", " ", "Null", "\\N"])


def _array_out_element(value: str | None, delimiter: str) -> str:
    if value is None:
        return "NULL"
    needs_quotes = (value == "" or value.upper() == "NULL"
                    or any(c in value for c in f'{delimiter}{{}}"\\') or any(c in _PG_SPACE for c in value))
    if not needs_quotes:
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array_out(values, delimiter: str = ",") -> str:
    if isinstance(values, list):
        return "{" + delimiter.join(_array_out(v, delimiter) for v in values) + "}"
    return _array_out_element(values, delimiter)


@settings(max_examples=300)
@given(st.lists(st.none() | tricky_text, max_size=8))
def test_array_of_text_round_trips(values):
    assert conv(ARRAY_OF[TEXT], _array_out(values)) == values


@settings(max_examples=200)
@given(st.integers(1, 4).flatmap(lambda width: st.lists(
    st.lists(st.none() | tricky_text, min_size=width, max_size=width), min_size=1, max_size=4)))
def test_two_dimensional_array_round_trips(rows):
    assert conv(ARRAY_OF[TEXT], _array_out(rows)) == rows


@settings(max_examples=200)
@given(st.lists(st.none() | tricky_text, min_size=1, max_size=6))
def test_array_with_semicolon_delimiter_round_trips(values):
    text_semicolon = converter_for(1020, {TEXT: TypeInfo(TEXT, "text", TypeKind.BASE, delimiter=";"),
                                          1020: TypeInfo(1020, "_box", TypeKind.ARRAY, element_oid=TEXT)})
    assert text_semicolon(_array_out(values, ";")) == values


def _range_bound_escape(value: str) -> str:
    needs_quotes = value == "" or any(c in value for c in '"\\()[],') or any(c in _PG_SPACE for c in value)
    escaped = value.replace("\\", "\\\\").replace('"', '""')
    return f'"{escaped}"' if needs_quotes else escaped


@settings(max_examples=300)
@given(st.none() | tricky_text, st.none() | tricky_text, st.booleans(), st.booleans())
def test_text_range_round_trips(lower, upper, lower_inc, upper_inc):
    lower_inc = lower_inc and lower is not None  # range_out prints '(' and ')' for unbounded sides
    upper_inc = upper_inc and upper is not None
    text = ("[" if lower_inc else "(") + ("" if lower is None else _range_bound_escape(lower)) + "," \
        + ("" if upper is None else _range_bound_escape(upper)) + ("]" if upper_inc else ")")
    assert conv(TEXTRANGE, text) == _range(lower, upper, lower_inc, upper_inc)


def _hstore_out(pairs: dict[str, str | None]) -> str:
    def quote(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ", ".join(f"{quote(k)}=>{'NULL' if v is None else quote(v)}" for k, v in pairs.items())


@settings(max_examples=300)
@given(st.dictionaries(tricky_text, st.none() | tricky_text, max_size=6))
def test_hstore_round_trips(pairs):
    assert hstore_to_dict(_hstore_out(pairs)) == pairs


def _copy_out(value: str | None) -> str:
    """CopyAttributeOutText: the escapes the server writes."""
    if value is None:
        return "\\N"
    table = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    return "".join(table.get(c, c) for c in value)


copy_text = (st.text(alphabet=st.sampled_from(list("\\\t\n\r\b\f\vNa é🎉\x00x0")), max_size=10)
             | st.sampled_from(["\\N", "\\", "N"]))


@settings(max_examples=300)
@given(st.lists(st.none() | copy_text, min_size=1, max_size=6))
def test_copy_line_round_trips(values):
    line = "\t".join(_copy_out(v) for v in values).encode() + b"\n"
    assert parse_copy_text_line(line) == values


@st.composite
def _copy_escaped_any_way(draw, value: str) -> bytes:
    """Every escape COPY FROM accepts, chosen at random per character: octal, hex, needless."""
    out = bytearray()
    for char in value:
        raw = char.encode()
        how = draw(st.sampled_from(["plain", "octal", "hex", "needless"]))
        if char in "\\\t\n\r" and how in ("plain", "needless"):
            how = "octal"
        if how == "plain":
            out += raw
        elif how == "octal":
            out += b"".join(b"\\%03o" % byte for byte in raw)
        elif how == "hex":
            out += b"".join(b"\\x%02x" % byte for byte in raw)
        elif char in "bfnrtvxN01234567":  # these would mean something else after a backslash
            out += raw
        else:
            out += b"\\" + raw
    return bytes(out)


@settings(max_examples=300)
@given(st.data(), st.lists(st.text(alphabet=st.sampled_from(list("\\\t\na é🎉\"xNb1")), max_size=8),
                           min_size=1, max_size=4))
def test_copy_line_with_any_escapes_round_trips(data, values):
    line = b"\t".join(data.draw(_copy_escaped_any_way(v)) for v in values)
    assert parse_copy_text_line(line) == values


# --- properties: malformed input fails with DecodeError only ----------------------------------

@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from(list('{}[]()",;:=\\ aNUL1é')), max_size=20))
def test_garbage_fails_only_with_decode_error(text):
    for oid in (ARRAY_OF[TEXT], TEXTRANGE, TEXTMULTIRANGE):
        try:
            conv(oid, text)
        except DecodeError:
            pass
    try:
        hstore_to_dict(text)
    except DecodeError:
        pass


@settings(max_examples=300)
@given(st.binary(max_size=30))
def test_garbage_copy_lines_fail_only_with_decode_error(line):
    try:
        values = parse_copy_text_line(line)
    except DecodeError:
        return
    assert all(v is None or isinstance(v, str) for v in values)


# --- COPY streams (a stand-in for psycopg2's copy_expert; the live tests use the real one) -------

class _FakeCopyCursor:
    """Writes ``chunks`` to the file like ``copy_expert`` does, then raises ``error`` if given;
    ``connection.cancel()`` ends a write loop that would otherwise go on forever."""

    def __init__(self, chunks, error: Exception | None = None, endless: bool = False) -> None:
        self.chunks, self.error, self.endless = chunks, error, endless
        self.cancelled = threading.Event()
        self.connection = self

    def cancel(self) -> None:
        self.cancelled.set()

    def copy_expert(self, sql, file) -> None:
        for chunk in self.chunks:
            file.write(chunk)
        while self.endless:
            if self.cancelled.wait(0.01):
                raise RuntimeError("canceling statement due to user request")
        if self.error is not None:
            raise self.error


@settings(max_examples=100)
@given(st.lists(st.lists(st.none() | copy_text, min_size=1, max_size=3), max_size=30), st.data())
def test_copy_stream_rows_survive_any_chunking(rows, data):
    stream = b"".join("\t".join(_copy_out(v) for v in row).encode() + b"\n" for row in rows)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)]) if b > a]
    batches = list(iter_copy_batches(_FakeCopyCursor(chunks), "COPY", batch_rows=4, max_batches=2))
    assert all(1 <= len(batch) <= 4 + len(rows) for batch in batches)
    assert [row for batch in batches for row in batch] == rows


def test_copy_stream_errors_reach_the_consumer_after_the_rows_before_them():
    rows = iter_copy_rows(_FakeCopyCursor([b"1\n", b"2\n"], error=LookupError("server gone")), "COPY")
    assert next(rows) == ["1"] and next(rows) == ["2"]
    with pytest.raises(LookupError, match="server gone"):
        next(rows)


def test_copy_stream_decode_errors_reach_the_consumer():
    with pytest.raises(DecodeError):
        list(iter_copy_rows(_FakeCopyCursor([b"ok\n", b"\xff\n"]), "COPY"))


def test_closing_a_copy_stream_early_stops_its_reader():
    cursor = _FakeCopyCursor([b"%d\n" % i for i in range(100)], endless=True)
    rows = iter_copy_rows(cursor, "COPY", batch_rows=1, max_batches=1)
    assert next(rows) == ["0"]
    rows.close()  # returns only once the reader thread has ended
    assert not any(t.name == "copy-reader" and t.is_alive() for t in threading.enumerate())
