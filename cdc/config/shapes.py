"""``cdc validate``'s checks against the captured shapes, for configs that need them.

Some settings mean something only against the tables' columns (a document sink's joins: columns,
keys, key types). Their config models are ``cdc.api.ShapeCheckedConfig``s. When one of them
``needs_shapes()``, the newest shape of every table is read from the log the file's ``log:``
names (``<prefix>.schema-changes``, through the sinks' own ``SchemaBook``), each such config is
asked, and every problem it answers is placed at its line of the file, under the config's path
(``sinks[2].documents[0].foreign_key[1]``). An embedded log that does not exist yet is not made:
it has captured nothing. A log that cannot be read is one problem naming why, and ``--offline``.
"""

from __future__ import annotations

from cdc.api import CapturedShape, CapturedShapes, ShapeCheckedConfig
from cdc.config.loader import Document
from cdc.config.model import AppConfig, LogConfig
from cdc.config.validate import format_path
from cdc.errors import CdcError, ConfigProblem


def shape_checked(config: AppConfig) -> list[tuple[int, ShapeCheckedConfig]]:
    """(index in ``sinks``, config) of every sink whose config wants the captured shapes."""
    return [(index, sink) for index, sink in enumerate(config.sinks)
            if isinstance(sink, ShapeCheckedConfig) and sink.needs_shapes()]


def read_shapes(log_config: LogConfig) -> CapturedShapes:
    """The newest shape of every table captured into the log ``log_config`` names."""
    from cdc.log.embedded import log_file
    from cdc.log.open import open_log
    from cdc.runtime.schemas import SchemaBook

    prefix = log_config.topic_prefix
    if log_config.kafka is None and not log_file(log_config.backend.path).exists():  # type: ignore[union-attr]
        return CapturedShapes(prefix, {})
    log = open_log(log_config)
    try:
        records = SchemaBook(log, prefix).newest_shapes()
    finally:
        log.close()
    return CapturedShapes(prefix, {topic: CapturedShape.of_record(record) for topic, record in records.items()})


def check_shapes(config: AppConfig, doc: Document) -> list[ConfigProblem]:
    """Every problem of the shape-checked configs in ``config`` (parsed from ``doc``), at its line."""
    checked = shape_checked(config)
    if not checked:
        return []
    try:
        shapes = read_shapes(config.log)
    except CdcError as err:
        return [ConfigProblem(doc.file, doc.line_of(("log",)), "log",
                              f"cannot read the captured shapes from the log ({err}); validate with --offline "
                              "to check the file without them")]
    problems = []
    for index, sink in checked:
        for path, message in sink.check_shapes(shapes):
            where = ("sinks", index, *path)
            problems.append(ConfigProblem(doc.file, doc.line_of(where), format_path(where), message))
    problems.sort(key=lambda p: (p.line is not None, p.line or 0))
    return problems
