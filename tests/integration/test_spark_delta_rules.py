"""The delta sink's rules that need no Spark session: topic patterns, type mapping, schema
evolution plans, config. (Here beside the sink's live tests; they run in milliseconds.)"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from pyspark.sql import types as T

from cdc.config.model import LogConfig
from cdc.errors import ConfigError, PermanentError
from cdc.plugins import sink_plugin
from spark_sinks.config import DeltaSinkConfig
from spark_sinks.delta import DeltaSink
from spark_sinks.evolve import plan
from spark_sinks.parse import topic_pattern
from spark_sinks.schemas import TableShape
from spark_sinks.tables import with_renames
from spark_sinks.types import fits, spark_type, widening


def test_the_subscribe_pattern_matches_the_globs_and_never_the_framework_topics():
    pattern = re.compile(topic_pattern(["cdc.public.*", "cdc.sales.order?"]))
    assert pattern.fullmatch("cdc.public.items")
    assert pattern.fullmatch("cdc.sales.orders")
    assert not pattern.fullmatch("cdc.sales.order_lines")
    assert not pattern.fullmatch("cdcXpublic.items")        # the dot is literal
    assert not pattern.fullmatch("cdc.public.offsets")
    assert not pattern.fullmatch("cdc.public.schema-changes")
    assert not pattern.fullmatch("cdc.public.dead-letter.lake")
    assert re.compile(topic_pattern(["x.[!a]*"])).fullmatch("x.b1")
    assert not re.compile(topic_pattern(["x.[!a]*"])).fullmatch("x.a1")


@pytest.mark.parametrize("source, expected", [
    ("integer", T.LongType()), ("smallint", T.LongType()), ("bigint", T.LongType()),
    ("int(11) unsigned", T.LongType()), ("bigint unsigned", T.DecimalType(20, 0)),
    ("numeric(10,2)", T.DecimalType(10, 2)), ("decimal(12,0)", T.DecimalType(12, 0)),
    ("numeric", T.StringType()), ("numeric(50,2)", T.StringType()),
    ("double precision", T.DoubleType()), ("real", T.DoubleType()), ("boolean", T.BooleanType()),
    ("tinyint(1)", T.LongType()), ("date", T.DateType()),   # MySQL's tinyint(1) arrives as 0/1
    ("timestamp with time zone", T.TimestampType()), ("timestamp(3) with time zone", T.TimestampType()),
    ("timestamp", T.TimestampType()),                     # MySQL's timestamp is an instant
    ("timestamp without time zone", T.TimestampNTZType()), ("datetime(6)", T.TimestampNTZType()),
    ("bytea", T.BinaryType()), ("longblob", T.BinaryType()),
    ("jsonb", T.StringType()), ("text[]", T.StringType()), ("_int4", T.StringType()), ("int4range", T.StringType()),
    ("uuid", T.StringType()), ("character varying(20)", T.StringType()), ("enum('a','b')", T.StringType()),
])
def test_source_types_map_to_spark_types(source, expected):
    assert spark_type(source) == expected


def test_which_values_fit_which_columns():
    assert fits(T.LongType(), T.StringType())                          # anything into text
    assert fits(T.DecimalType(6, 2), T.DecimalType(10, 2))
    assert not fits(T.DecimalType(10, 2), T.DecimalType(6, 2))
    assert not fits(T.DecimalType(10, 3), T.DecimalType(10, 2))          # would round
    assert fits(T.LongType(), T.DecimalType(20, 0)) and not fits(T.LongType(), T.DecimalType(10, 0))
    assert not fits(T.StringType(), T.LongType())
    assert widening(T.DecimalType(10, 2), T.DecimalType(12, 2))
    assert widening(T.DecimalType(10, 2), T.DecimalType(12, 4))
    assert not widening(T.DecimalType(10, 2), T.DecimalType(12, 5))     # integer digits would shrink
    assert widening(T.DateType(), T.TimestampNTZType())
    assert not widening(T.LongType(), T.StringType())


def _table(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(n, t) for n, t in fields]
                        + [T.StructField("__cdc_key", T.StringType()), T.StructField("__cdc_version", T.LongType())])


def test_a_schema_plan_adds_casts_widens_and_refuses():
    shape = TableShape((("id", T.LongType()), ("price", T.DecimalType(12, 2)), ("qty", T.LongType()),
                        ("name", T.LongType()), ("note", T.StringType())), ("id",), True)
    table = _table(("id", T.LongType()), ("price", T.DecimalType(10, 2)), ("qty", T.StringType()),
                   ("name", T.LongType()), ("gone", T.StringType()))
    result = plan(shape, table, ("id",))
    assert [f.name for f in result.add] == ["note"]
    assert result.widen == [("price", T.DecimalType(12, 2))]
    assert result.casts == {"qty": T.StringType()}
    assert result.incompatible == []

    narrower = TableShape((("id", T.LongType()), ("qty", T.StringType())), ("id",), True)
    assert plan(narrower, _table(("id", T.LongType()), ("qty", T.LongType())), ("id",)).incompatible == [
        "column qty: string values do not fit the table's bigint"]
    rekeyed = TableShape((("id", T.LongType()), ("sku", T.StringType())), ("id", "sku"), True)
    assert plan(rekeyed, _table(("id", T.LongType()), ("sku", T.StringType())), ("id",)).incompatible == [
        "the key changed from (id) to (id, sku)"]


def test_a_schema_plan_renames_a_column_the_source_renamed_in_place():
    record = {"columns": [{"name": "id", "type": "integer", "key": True},
                          {"name": "remark", "type": "numeric(14,4)", "renamed_from": "note"}]}
    shape = TableShape.from_record(record)
    assert shape.earlier == (("remark", ("note",)),)
    result = plan(shape, _table(("id", T.IntegerType()), ("note", T.DecimalType(12, 2))), ("id",))
    assert result.rename == [("note", "remark")]
    assert result.add == []
    assert result.widen == [("remark", T.DecimalType(14, 4))]   # the type follows, under the new name
    # Already renamed (a replayed batch), or the old name still a column of the shape: nothing to rename.
    assert plan(shape, _table(("id", T.IntegerType()), ("remark", T.DecimalType(14, 4))), ("id",)).rename == []
    both = TableShape((("id", T.IntegerType()), ("note", T.StringType()), ("remark", T.StringType())), ("id",),
                      True, (("remark", ("note",)),))
    assert plan(both, _table(("id", T.IntegerType()), ("note", T.StringType())), ("id",)).rename == []


def test_a_schema_plan_chains_the_renames_of_the_shapes_the_table_skipped():
    """renamed_from names the column in the shape just before: a table that still has ``note``
    when the newest shape says ``remark`` renamed_from ``memo`` renames note to remark, and the
    name passed on the way is kept for rows of that shape (read later); a shape in between gives
    only its renames, not its columns."""
    shapes = [{"columns": [{"name": "id", "type": "integer", "key": True}, {"name": "note", "type": "text"}]},
              {"columns": [{"name": "id", "type": "integer", "key": True}, {"name": "memo", "type": "text",
                                                                          "renamed_from": "note"},
                           {"name": "early", "type": "text"}]},
              {"columns": [{"name": "id", "type": "integer", "key": True}, {"name": "Remark", "type": "text",
                                                                          "renamed_from": "memo"}]}]
    shape = TableShape.from_record(shapes[-1], before=shapes[:-1])
    assert shape.earlier == (("Remark", ("memo", "note")),)
    assert shape.former_names == {"memo", "note"}
    result = plan(shape, _table(("id", T.LongType()), ("NOTE", T.StringType())), ("id",))
    assert (result.rename, result.passed, result.add) == ([("NOTE", "Remark")], {"Remark": ("memo",)}, [])
    # The table at the middle shape: one rename, nothing passed.
    result = plan(shape, _table(("id", T.LongType()), ("memo", T.StringType())), ("id",))
    assert (result.rename, result.passed) == ([("memo", "Remark")], {})
    # Already renamed (a replayed batch): nothing to do.
    assert plan(shape, _table(("id", T.LongType()), ("remark", T.StringType())), ("id",)).rename == []
    # A table made in shape 3 before the renames were chained knew remark's last earlier name only:
    # rows under note still find their column.
    assert shape.with_former({"Remark": ["memo"], "x": ["y"]}) == {"Remark": ["memo", "note"], "x": ["y"]}


def test_a_renamed_column_remembers_its_earlier_names_newest_first():
    former = with_renames({}, [("b", ("a",))])
    assert former == {"b": ["a"]}
    assert with_renames(former, [("c", ("b",))]) == {"c": ["b", "a"]}
    assert with_renames({"c": ["b", "a"]}, [("a", ("c",))]) == {"a": ["c", "b"]}   # back to a name it had
    # Over two shapes at once: the name passed on the way, then the table's, then its earlier ones.
    assert with_renames({"b": ["a"]}, [("d", ("c", "b"))]) == {"d": ["c", "b", "a"]}


def _config(**overrides) -> dict:
    return {"name": "lake", "type": "delta", "topics": ["cdc.public.*"], "path": "lake",
            "checkpoint": "s3a://bucket/cp", **overrides}


def test_the_config_resolves_local_paths_and_refuses_contradictions(tmp_path):
    config = DeltaSinkConfig.model_validate(_config(), context={"base_dir": tmp_path})
    assert config.path == str(tmp_path / "lake")
    assert config.checkpoint == "s3a://bucket/cp"          # URIs stay as written
    with pytest.raises(ValidationError, match="scd2 keeps deleted rows"):
        DeltaSinkConfig.model_validate(_config(scd2=True, soft_delete=True))
    with pytest.raises(ValidationError, match="extra"):
        DeltaSinkConfig.model_validate(_config(merge_schema=True))
    assert sink_plugin("delta") is DeltaSink


def test_the_sink_runs_itself_and_needs_kafka():
    sink = DeltaSink(DeltaSinkConfig.model_validate(_config()))
    assert DeltaSink.runs_itself
    with pytest.raises(PermanentError, match="reads its topics itself"):
        sink.write([])
    sink.log_config = LogConfig.model_validate({"embedded": {}})
    with pytest.raises(ConfigError, match="needs Kafka"):
        sink.start()


def test_a_local_session_has_one_shuffle_partition_per_core():
    """Each shuffle partition of a MERGE's output is a file that later MERGEs scan and mark;
    local[2] had four."""
    from spark_sinks.session import local_cores, shuffle_partitions

    assert local_cores("local") == 1
    assert local_cores("local[2]") == 2
    assert local_cores("local[3, 2]") == 3
    assert local_cores("local[*]") >= 1
    assert local_cores("spark://host:7077") is None and local_cores("local-cluster[2,1,1024]") is None
    assert shuffle_partitions("local[2]") == {"spark.sql.shuffle.partitions": "2"}
    assert shuffle_partitions("yarn") == {"spark.sql.shuffle.partitions": "4"}


def test_an_absent_delete_memory_is_asked_for_once(monkeypatch):
    """A table without deletes asked Delta whether its memory exists in every batch (a read of
    the memory's log); the sink is the memory's one writer, so the answer is kept until it
    writes the memory or forgets its tables."""
    from spark_sinks import tables
    from spark_sinks.tables import DeltaTarget

    asked = []

    def is_delta_table(session, path):
        asked.append(path)
        return False

    monkeypatch.setattr(tables.DeltaTable, "isDeltaTable", is_delta_table)
    target = DeltaTarget("/lake", "cdc.public.orders", "cdc", "type1")
    assert not target.deletes_exist(None) and not target.deletes_exist(None)
    assert asked == ["/lake/_cdc_deletes/public/orders"]
    target.deletes_written()
    assert target.deletes_exist(None) and len(asked) == 1
    target.forget()
    assert not target.deletes_exist(None) and len(asked) == 2
