"""The log formats the delta sink reads, and the error for one it does not.

The sink reads Kafka with Spark, past the framework's decoding (``cdc/sink_events.py``), so it
decodes each format itself (``parse.envelopes`` recognizes the format of each record,
``parse.RowDecoder`` reads its values). A format is listed here once both can read it: a sink
started on a log of another format would otherwise dead-letter every record, so it refuses to
start with a ``ConfigError`` naming the sink and the format.

Adding a format: recognize its records in ``parse.envelopes`` (as ``avro_records`` does
Confluent's magic byte and schema id), give their rows a ``codec`` of their own, read them in
``RowDecoder``, then list it in ``FORMATS``.
"""

from __future__ import annotations

from cdc.api import ConfigError

FORMATS = ("json", "debezium-json", "avro")


def check_format(sink: str, fmt: str | None) -> None:
    """Raise ``ConfigError`` unless the delta sink ``sink`` reads the log format ``fmt``
    (None: the log's default, ``json``)."""
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"sink {sink} (delta) cannot read log.format {fmt!r}: it reads "
                          f"{', '.join(FORMATS)}; keep one of those for the topics it reads")
