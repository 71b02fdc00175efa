"""The OpenSearch sink (``type: opensearch``): one index per table, kept in sync with its topic
through versioned bulk writes, read through aliases, rebuilt into generations. See README.md.

    config.py       OpenSearchSinkConfig, IndexOptions (per table: columns, renames, mappings, settings)
    naming.py       alias names from a template, generation indexes <alias>__g<N>, document _ids
    mapping.py      source column types -> field mappings; comparing a new shape with a live mapping
    documents.py    rows -> document bodies (columns, renames); a batch -> the newest action per _id
    indexes.py      each topic's index per generation: creation, live mapping changes, schema_policy,
                    truncates, status
    lines.py        a topic's actions -> bulk items with their NDJSON lines in one pass (_lines.c:
                    this loop and documents.reduce's in C, where built; the Python is the reference)
    bulk.py         versioned bulk requests sized in documents and bytes, several in flight,
                    429s backed off, refusals returned with their reasons
    tombstones.py   deletes as hidden tombstone documents (they outlive index.gc_deletes), purge
    generations.py  aliases over generations; the sink's record in the index cdc-sink-state
    client.py       the opensearch-py client: hosts, basic auth and/or a client certificate, TLS
    errors.py       opensearch-py errors -> RetriableError / PermanentError, by status and type
    sink.py         OpenSearchSink: lifecycle, the write, generations for rebuilds
"""

from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.sink import OpenSearchSink

__all__ = ["OpenSearchSink", "OpenSearchSinkConfig"]
