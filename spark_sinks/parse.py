"""Kafka records to change rows: the envelope parsed with an explicit schema, per-key reduction.

Everything here is Spark SQL expressions (no Python UDFs but one for decimals wider than Spark's,
see connect_json.py), so executors need only Spark, and the JSON is tokenized by Spark's own
parser. The envelope is parsed once with ``before``/``after`` declared as strings: Spark keeps a
nested object's JSON text for a string field, so a row's columns are parsed later, with the
table's own schema, only for the rows that survive the per-key reduction.

Each record is recognized by its own shape, as the framework's sink runtime does
(``cdc/sink_events.py``), so a topic whose format changed midway is read too: a ``json``
envelope, or a Kafka Connect JSON one (``debezium-json``: ``{"schema", "payload"}``) whose
payload holds the same envelope in Debezium's encodings. The envelope's fields come out the same
from either; the row's values stay in their format's encoding in ``data``, with ``codec`` naming
how to read them (NULL: the ``json`` format's forms; else the hash of the record's Connect
schema, see ``connect_json.ConnectCodecs``), and ``RowDecoder`` turns them into the table's
columns. An ``avro`` record (Confluent's framing: byte 0 and a schema id) is decoded with
spark-avro by its writer schema and its rows printed as Connect JSON text, so from there on it is
read like a ``debezium-json`` one, its schema id as its ``codec`` (``avro_records.py``). The
formats the sink accepts are listed in ``formats.py``.

A tombstone's version is its delete's, from the record's ``cdc.version`` header (the Kafka source
reads headers, ``includeHeaders``): with it, the tombstone is a versioned delete of the key (its
``op`` stays NULL, ``latest_per_key`` makes it a ``d``); without it (a record from before headers,
or a frame without a ``headers`` column) its version is NULL, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cdc.api import INTERNAL_TOPICS_LOOKAHEAD, VERSION_HEADER
from spark_sinks import avro_records, connect_json
from spark_sinks.avro_records import WriterSchema
from spark_sinks.connect_json import ConnectCodecs

# Bookkeeping columns of the tables; every one begins with this prefix.
PREFIX = "__cdc_"
KEY, VERSION, OP, TS = "__cdc_key", "__cdc_version", "__cdc_op", "__cdc_ts_ms"
DELETED = "__cdc_deleted"
VALID_FROM, VALID_TO, CURRENT = "__cdc_valid_from", "__cdc_valid_to", "__cdc_current"

UPSERTS = ("r", "c", "u")
ROW_OPS = ("r", "c", "u", "d")

ENVELOPE = T.StructType([
    T.StructField("before", T.StringType()),
    T.StructField("after", T.StringType()),
    T.StructField("op", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("source", T.StructType([
        T.StructField("version", T.LongType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("schema_version", T.LongType()),   # the shape the row names (docs/architecture.md)
    ])),
    # The debezium-json format: the Connect schema's text (hashed into the codec) and the envelope.
    T.StructField("schema", T.StringType()),
    T.StructField("payload", connect_json.PAYLOAD),
    # Spark's PERMISSIVE parsing puts the text of a record it cannot read (not JSON, or a field of
    # the wrong type) here and leaves the other fields NULL.
    T.StructField("_corrupt_record", T.StringType()),
])


def topic_pattern(globs: Iterable[str]) -> str:
    """The Java regex for Kafka's ``subscribePattern``: any of ``globs`` (fnmatch syntax), never
    the framework's own topics (offsets, schema changes, dead letters)."""
    alternatives = []
    for glob in globs:
        out, i = [], 0
        while i < len(glob):
            ch = glob[i]
            if ch == "*":
                out.append(".*")
            elif ch == "?":
                out.append(".")
            elif ch == "[" and "]" in glob[i + 1:]:
                end = glob.index("]", i + 1)
                body = glob[i + 1:end]
                negate = body.startswith("!")
                body = re.sub(r"([\\\[\]^])", r"\\\1", body[1:] if negate else body)
                out.append(f"[{'^' if negate else ''}{body}]")
                i = end
            else:
                out.append(re.escape(ch) if not ch.isalnum() else ch)
            i += 1
        alternatives.append("".join(out))
    return f"{INTERNAL_TOPICS_LOOKAHEAD}(?:{'|'.join(alternatives)})"


def header_version(raw: DataFrame) -> Column:
    """The last ``cdc.version`` header's value as a bigint (NULL: none, or a frame without
    headers); a value that is not a decimal int64 is NULL too, and ``invalid_header_version`` says so."""
    if "headers" not in raw.columns:
        return F.lit(None).cast("long")
    text = _header_text(raw)
    return F.when(text.rlike("^-?[0-9]{1,19}$"), text.try_cast("long"))


def invalid_header_version(raw: DataFrame) -> Column:
    if "headers" not in raw.columns:
        return F.lit(False)
    return _header_text(raw).isNotNull() & header_version(raw).isNull()


def _header_text(raw: DataFrame) -> Column:
    found = F.filter(F.col("headers"), lambda header: header.getField("key") == F.lit(VERSION_HEADER))
    return F.try_element_at(found, F.lit(-1)).getField("value").cast("string")


def envelopes(raw: DataFrame, avro: dict[int, WriterSchema] | None = None) -> DataFrame:
    """Kafka source rows -> one row per record: topic, partition, offset, ``__cdc_key`` (the key's
    JSON), ``op`` (NULL for a tombstone), ``version`` (a tombstone's from its header, or NULL),
    ``ts_ms`` (the source's commit time),
    ``data`` (the row's JSON: after, else before, else the key), ``codec`` (how ``data`` is
    encoded: NULL for the ``json`` format), ``value_codec`` and ``key_codec`` (the Connect
    schemas of value and key, NULL for ``json``), ``unknown_avro`` (the schema ids of an ``avro``
    record that are not in ``avro``, the writer schemas known so far), ``poison`` (why the
    record is not a change event, or NULL) and ``raw`` (a poison record's value)."""
    avro = avro or {}
    # Two projections: the envelope is parsed once, its fields read from the result (Spark does
    # not merge projections that would repeat an expensive expression).
    key_text = F.col("key").cast("string")
    avro_value, avro_key = avro_records.framed(F.col("value")), avro_records.framed(F.col("key"))
    values = avro_records.decoded(F.col("value"), avro, envelope=True)
    keys = avro_records.decoded(F.col("key"), avro, envelope=False)
    parsed = raw.select("topic", "partition", "offset", key_text.alias("key_text"),
                        F.when(avro_value, F.base64("value")).otherwise(F.col("value").cast("string")).alias("value"),
                        F.when(~avro_value, F.from_json(F.col("value").cast("string"), ENVELOPE)).alias("env"),
                        # a json key needs no second parse: only a key naming a schema gets one
                        F.when(~avro_key & (F.instr(key_text, '"schema"') > 0),
                               F.from_json(key_text, connect_json.KEY)).alias("connect_key"),
                        avro_value.alias("avro_value"), avro_key.alias("avro_key"),
                        avro_records.schema_id(F.col("value")).alias("value_id"),
                        avro_records.schema_id(F.col("key")).alias("key_id"),
                        header_version(raw).alias("header_version"),
                        invalid_header_version(raw).alias("bad_header_version"),
                        *[record.alias(f"avro_v{i}") for i, record in values],
                        *[record.alias(f"avro_k{i}") for i, record in keys])
    env, value = F.col("env"), F.col("value")
    payload, connect_key = env.getField("payload"), F.col("connect_key")
    connect = F.coalesce(connect_json.is_connect(env.getField("schema"), payload), F.lit(False))
    keyed = F.coalesce(connect_json.is_connect(connect_key.getField("schema"), connect_key.getField("payload")),
                       F.lit(False))
    value_id, key_id = F.col("value_id"), F.col("key_id")
    avro_payload = None   # per known id, its decoded envelope in connect_json.PAYLOAD's shape
    for i, _ in values:
        branch = avro_records.payload(F.col(f"avro_v{i}"), avro[i])
        avro_payload = F.when(value_id == F.lit(i), branch) if avro_payload is None \
            else avro_payload.when(value_id == F.lit(i), branch)
    avro_key_text = F.lit(None).cast("string")
    for i, _ in keys:
        avro_key_text = F.when(key_id == F.lit(i), avro_records.key_text(F.col(f"avro_k{i}"))).otherwise(avro_key_text)
    envelope = F.when(connect, payload).otherwise(F.struct(
        env.getField("before").alias("before"), env.getField("after").alias("after"),
        env.getField("op").alias("op"), env.getField("ts_ms").alias("ts_ms"),
        F.struct(env.getField("source").getField("version").alias("cdc_version"),
                 env.getField("source").getField("ts_ms").alias("ts_ms"),
                 env.getField("source").getField("schema_version").alias("cdc_schema_version")).alias("source")))
    if values:
        envelope = F.when(F.col("avro_value"), avro_payload).otherwise(envelope)
    known_values = value_id.isin(*[i for i, _ in values]) if values else F.lit(False)
    known_keys = key_id.isin(*[i for i, _ in keys]) if keys else F.lit(False)
    key = F.when(F.col("avro_key"), avro_key_text).when(keyed, connect_key.getField("payload")) \
        .otherwise(F.col("key_text"))
    value_codec = F.when(F.col("avro_value"), F.when(known_values, value_id)) \
        .when(connect, connect_json.codec_of(env.getField("schema")))
    key_codec = F.when(F.col("avro_key"), F.when(known_keys, key_id)) \
        .when(keyed, connect_json.codec_of(connect_key.getField("schema")))
    unknown = F.array_compact(F.array(F.when(F.col("avro_value") & ~value_id.isin(*avro), value_id)
                                      if avro else F.when(F.col("avro_value"), value_id),
                                      F.when(F.col("avro_key") & ~key_id.isin(*avro), key_id)
                                      if avro else F.when(F.col("avro_key"), key_id)))
    normalized = parsed.select(
        "topic", "partition", "offset", key.alias(KEY), "value", envelope.alias("e"), connect.alias("connect"),
        env.getField("_corrupt_record").alias("corrupt"), value_codec.alias("value_codec"),
        key_codec.alias("key_codec"), "avro_value", unknown.alias("unknown_avro"), "header_version",
        "bad_header_version")
    e, key, tombstone = F.col("e"), F.col(KEY), value.isNull()
    op = e.getField("op")
    version = F.when(tombstone, F.col("header_version")).otherwise(e.getField("source").getField("cdc_version"))
    row = F.coalesce(e.getField("after"), e.getField("before"))
    poison = (F.when(~tombstone & (F.size("unknown_avro") > 0), F.lit("an avro schema id not read from the registry"))
              .when(~tombstone & F.col("avro_value") & e.isNull(),
                    F.lit("not an avro change envelope of its schema id"))
              .when(~tombstone & F.col("corrupt").isNotNull(), F.lit("not JSON, or a field of the wrong type"))
              .when(~tombstone & ~F.coalesce(op.isin(*ROW_OPS, "t"), F.lit(False)), F.lit("no known op"))
              .when(~tombstone & version.isNull(),
                    F.when(F.col("connect") | F.col("avro_value"), F.lit("no integer source.cdc_version"))
                    .otherwise(F.lit("no integer source.version")))
              .when(key.isNull() & (tombstone | (op != "t")), F.lit("no key"))
              .when(tombstone & F.col("bad_header_version"), F.lit("a tombstone whose cdc.version header is "
                                                                 "not a decimal integer")))
    return normalized.select(
        "topic", "partition", "offset", KEY, op.alias("op"), version.alias("version"),
        e.getField("source").getField("ts_ms").alias("ts_ms"),
        e.getField("source").getField("cdc_schema_version").alias("schema_version"),
        F.coalesce(row, key).alias("data"),
        F.when(row.isNotNull(), F.col("value_codec")).otherwise(F.col("key_codec")).alias("codec"),
        "value_codec", "key_codec", "unknown_avro",
        poison.alias("poison"),
        F.when(poison.isNotNull(), value).alias("raw"),   # kept only for the dead-letter topic
    )


def learn_schemas(raw: DataFrame, codecs: ConnectCodecs, value_codecs: set[int], key_codecs: set[int]) -> None:
    """Read the Connect schemas named ``value_codecs`` and ``key_codecs`` from ``raw`` (the Kafka
    rows they came in) into ``codecs``. The schemas are not kept with the rows (a few KB each, on
    every record): a new one costs this second read of its batch, once per schema."""
    value_schema = F.from_json(F.col("value").cast("string"), ENVELOPE).getField("schema")
    key_schema = F.from_json(F.col("key").cast("string"), connect_json.KEY).getField("schema")
    texts = (raw.select(F.array(F.struct(F.lit("value").alias("part"), value_schema.alias("text")),
                                F.struct(F.lit("key").alias("part"), key_schema.alias("text"))).alias("parts"))
             .select(F.explode("parts").alias("p")).select("p.part", "p.text")
             .where(F.col("text").startswith("{"))
             .withColumn("codec", connect_json.codec_of(F.col("text"))))
    wanted = [("value", c) for c in value_codecs] + [("key", c) for c in key_codecs]
    wanted_cond = F.lit(False)
    for part, codec in wanted:
        wanted_cond = wanted_cond | ((F.col("part") == part) & (F.col("codec") == F.lit(codec)))
    for found in texts.where(wanted_cond).groupBy("part", "codec").agg(F.first("text").alias("text")).collect():
        if found["part"] == "value":
            codecs.learn_value(found["codec"], found["text"])
        else:
            codecs.learn_key(found["codec"], found["text"])


def connect_keys(rows: DataFrame, codecs: ConnectCodecs, key_codecs: set[int], struct: T.StructType) -> DataFrame:
    """``rows`` with each Connect key whose payload differs from the ``json`` format's key (a
    numeric or date key; ``struct``, the table's types, tells an unsigned bigint) rewritten into
    that key's text, so both formats MERGE on one key."""
    rewrite = [c for c in key_codecs if connect_json.key_needs_rewrite(codecs.get(c), struct)]
    if not rewrite:
        return rows
    key = F.col(KEY)
    for codec in rewrite:
        key = F.when(F.col("key_codec") == F.lit(codec), connect_json.key_text(F.col(KEY), codecs.get(codec), struct)) \
            .otherwise(key)
    return rows.withColumn(KEY, key)


def row_changes(rows: DataFrame) -> DataFrame:
    """The records that change rows: upserts, deletes (versioned) and tombstones (op NULL)."""
    return rows.where(F.col("poison").isNull() & (F.col("op").isNull() | F.col("op").isin(*ROW_OPS)))


def latest_per_key(changes: DataFrame) -> DataFrame:
    """One row per key: the record with the highest version (ties: a record with an envelope, then
    the later offset).

    A tombstone says that the key's latest record is a delete. With its delete's version (its
    header) it is that delete (op ``d``), ranked by version like any record; at an equal version
    the delete itself wins (it has the old row). One without a version (from before headers):
    any versioned record of the key in the batch outranks it (the delete before it says the
    same, with a version; an insert after one is newer), and a key with nothing but such
    tombstones keeps one, as a delete of unknown version (op ``d``, version NULL)."""
    order = F.struct(F.col("version").isNotNull().cast("int"), F.coalesce("version", F.lit(-(1 << 63))),
                     F.col("op").isNotNull().cast("int"), F.col("offset"), F.col("partition"))
    payload = F.struct(F.coalesce("op", F.lit("d")).alias("op"), "version", "ts_ms", "data", "codec")
    return (changes.groupBy(KEY).agg(F.max_by(payload, order).alias("r"))
            .select(KEY, "r.op", "r.version", "r.ts_ms", "r.data", "r.codec"))


def _cast(value: Column, field: T.StructField, casts: dict[str, T.DataType]) -> Column:
    target = casts.get(field.name)
    return value.cast(target) if target is not None and target != field.dataType else value


def _former_names(struct: T.StructType, former: dict[str, list[str]] | None) -> dict[str, list[str]]:
    """column -> its earlier names (newest first) that are not columns now."""
    names = {field.name for field in struct.fields}
    return {name: [old for old in olds if old not in names]
            for name, olds in (former or {}).items() if name in names}


class RowDecoder:
    """The table's data columns from each record's ``data`` as its ``codec`` says: the ``json``
    format's rows parsed with ``struct`` (the source's types); each Connect schema's rows with
    its own JSON types, converted (connect_json.py); then cast where the table's column differs
    (``casts``). ``prepare`` adds the parsed rows to a frame (one parse per record, whatever
    the number of columns), ``columns`` reads the columns from them.

    A column with earlier names (``former``: column -> names, newest first) takes its value from
    the first of them that a row has when the row lacks the column: a row of a shape before a
    rename.

    A double column that a shape before was a decimal or text in (``was_text``, see
    ``TableShape.was_text``) is read as its JSON text and cast: rows of that shape carry a string
    (``"1.01"``), which Spark's JSON reader reads as NULL into a double."""

    def __init__(self, struct: T.StructType, casts: dict[str, T.DataType], codecs: ConnectCodecs,
                 used: set[int], former: dict[str, list[str]] | None = None,
                 was_text: frozenset[str] = frozenset()) -> None:
        self.struct, self.casts = struct, casts
        self.former = _former_names(struct, former)
        self.was_text = {f.name for f in struct.fields if f.name in was_text and isinstance(f.dataType, T.DoubleType)}
        fields = [T.StructField(f.name, T.StringType(), True) if f.name in self.was_text else f for f in struct.fields]
        extra: dict[str, T.StructField] = {}   # an earlier name, read with its column's type
        for field in fields:
            for old in self.former.get(field.name, ()):
                extra.setdefault(old, T.StructField(old, field.dataType, True))
        self.json_struct = T.StructType([*fields, *extra.values()])
        self.connect = [(codec, *self._connect_parse(codecs.get(codec))) for codec in sorted(used)]

    def _connect_parse(self, row) -> tuple[T.StructType, list[tuple[str, connect_json.FieldReader]]]:
        """The JSON schema to parse a row of Connect schema ``row`` with, and per column of the
        table the name the row carries it under (an earlier one in a row from before a rename)
        with its reader."""
        readers, fields = [], []
        for field in self.struct.fields:
            name = field.name
            if row.field(name) is None:
                name = next((old for old in self.former.get(field.name, ()) if row.field(old) is not None), name)
            reader = connect_json.row_reader(row.field(name), field.dataType)
            readers.append((name, reader))
            fields.append(T.StructField(name, reader.json_type))
        return T.StructType(fields), readers

    def json_value(self, parsed: Column, field: T.StructField) -> Column:
        value = parsed.getField(field.name)
        olds = self.former.get(field.name)
        value = F.coalesce(value, *(parsed.getField(old) for old in olds)) if olds else value
        # The number's text, or a decimal's, or "NaN"/"Infinity": Java's parse, the nearest double.
        return value.try_cast(T.DoubleType()) if field.name in self.was_text else value

    def prepare(self, frame: DataFrame) -> DataFrame:
        data, codec = F.col("data"), F.col("codec")
        if not self.connect:
            return frame.withColumn("_row_json", F.from_json(data, self.json_struct))
        parsed = [F.when(codec.isNull(), F.from_json(data, self.json_struct)).alias("_row_json")]
        for i, (value, parse, _) in enumerate(self.connect):
            parsed.append(F.when(codec == F.lit(value), F.from_json(data, parse)).alias(f"_row_{i}"))
        return frame.select("*", *parsed)

    def columns(self) -> list[Column]:
        out = []
        for index, field in enumerate(self.struct.fields):
            value = self.json_value(F.col("_row_json"), field)
            if self.connect:
                choice = F.when(F.col("codec").isNull(), value)
                for i, (codec, _, readers) in enumerate(self.connect):
                    name, reader = readers[index]
                    choice = choice.when(F.col("codec") == F.lit(codec),
                                         reader.convert(F.col(f"_row_{i}").getField(name)))
                value = choice
            out.append(_cast(value, field, self.casts).alias(field.name))
        return out


def summarize(rows: DataFrame) -> list[Row]:
    """Per topic: records, the newest truncate, poison records, whether there are deletes, the
    column names the rows have and the key's column names (one small aggregation)."""
    clean = F.col("poison").isNull()
    op = F.col("op")
    return rows.groupBy("topic").agg(
        F.count(F.lit(1)).alias("records"),
        F.count(F.when(clean & op.isin("r", "c", "u", "d") | clean & op.isNull(), 1)).alias("changes"),
        F.max(F.when(clean & (op == "t"), F.col("version"))).alias("truncated_at"),
        F.count(F.when(~clean, 1)).alias("poison"),
        F.max(F.when(clean & ((op == "d") | (op.isNull() & F.col("version").isNotNull())), 1))
        .isNotNull().alias("deletes"),
        F.max(F.col("ts_ms")).alias("newest_ts"),
        F.max(F.when(clean, F.col("schema_version"))).alias("newest_shape"),
        F.min(F.col("ts_ms")).alias("oldest_ts"),
        F.array_distinct(F.flatten(F.collect_set(
            F.when(clean & op.isin(*UPSERTS), F.json_object_keys("data"))))).alias("names"),
        F.first(F.when(clean & (op != "t") | clean & op.isNull(), F.json_object_keys(KEY)),
                ignorenulls=True).alias("key_names"),
        F.collect_set(F.when(clean, F.col("codec"))).alias("codecs"),
        F.collect_set(F.when(clean, F.col("value_codec"))).alias("value_codecs"),
        F.collect_set(F.when(clean, F.col("key_codec"))).alias("key_codecs"),
        F.array_distinct(F.flatten(F.collect_set("unknown_avro"))).alias("unknown_avro"),
    ).collect()
