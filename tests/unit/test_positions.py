import pytest

from cdc.positions import Counter, MySqlPosition, PgLsn, SnapshotProgress, position_from_json, position_to_json


@pytest.mark.parametrize("position", [
    PgLsn(0), PgLsn(0x16B3748), PgLsn((1 << 64) - 1),
    MySqlPosition("binlog.000003", 1234), MySqlPosition("mysql-bin.000001", 4, "0-1-42,1-2-7"),
    MySqlPosition("binlog.000010", 99, "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5"),
    Counter(7),
    SnapshotProgress(PgLsn(0x1000), ("public.a",), "public.b", (42, "x")),
    SnapshotProgress(MySqlPosition("binlog.000002", 4), (), None, None, {"chunk": 3}),
])
def test_json_round_trip(position):
    text = position_to_json(position)
    back = position_from_json(text)
    assert back == position and type(back) is type(position)
    assert position_to_json(back) == text


def test_lsn_text_form_matches_postgres():
    assert str(PgLsn.parse("16/B374D848")) == "16/B374D848"
    assert PgLsn.parse("0/16B3748").lsn == 0x16B3748
    assert PgLsn.parse("1/0") > PgLsn.parse("0/FFFFFFFF")
    with pytest.raises(ValueError):
        PgLsn.parse("16B3748")
    with pytest.raises(ValueError):
        PgLsn(-1)


def test_mysql_position_validation_and_file_order():
    with pytest.raises(ValueError):
        MySqlPosition("binlog.000001", 3)
    assert MySqlPosition("binlog.000010", 4).file_index > MySqlPosition("binlog.000009", 900).file_index


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown position kind"):
        position_from_json('{"kind": "oracle_scn", "scn": 1}')
