"""The index of each topic in a generation: created, evolved with the source's schema, truncated.

An index's ``_meta.cdc`` records what it was made from: the topic, the schema record's version,
a fingerprint of the user's settings for it (``tables:`` entry and ``settings``), and the newest
truncate's version. A new schema record is compared with the live mapping (mapping.compare):
new columns are added to the mapping live; a column whose field would change (``integer`` ->
``text``) cannot be followed by OpenSearch, and ``schema_policy`` decides: ``fail``
(``SchemaChangeError``: the sink stops until someone acts), ``ignore`` (write on; documents the
old field refuses go to the dead letters) or ``rebuild`` (``RebuildRequired``: the runtime fills a
new generation from the topic, made with the new mapping). A change of the user's mappings or
settings in the config is followed by a rebuild too, whatever the policy: only a new index can
take new analyzers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdc.api import RebuildRequired, SchemaChangeError
from sinks.opensearch.config import OpenSearchSinkConfig
from sinks.opensearch.documents import TableLayout
from sinks.opensearch.generations import Generations
from sinks.opensearch.mapping import DELETED_FIELD, VERSION_FIELD, Shape, compare, fingerprint, shape_of
from sinks.opensearch.naming import alias_name, generation_index

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Target:
    alias: str
    topic: str
    index: str
    generation: int
    layout: TableLayout
    properties: dict[str, dict]          # the live mapping's properties
    meta: dict[str, Any]                 # _meta.cdc

    @property
    def truncated_before(self) -> int | None:
        return self.meta.get("truncated_before")


class IndexCatalog:
    def __init__(self, client, config: OpenSearchSinkConfig, generations: Generations,
                 schema_for: Callable[..., dict | None]) -> None:
        self.client = client
        self.config = config
        self.generations = generations
        self.schema_for = schema_for
        self._targets: dict[tuple[str, int], Target] = {}

    def forget(self) -> None:
        self._targets.clear()

    # -- preparing a topic's index ---------------------------------------------------------------
    def prepare(self, topic: str, source: dict, generation: int, *, following: bool) -> Target:
        """The index of ``topic`` in ``generation``, ready for rows of the shape ``source``
        names; ``following``: the sink writes the generation readers see (not a rebuild's)."""
        target = self._targets.get((topic, generation))
        if target is None:  # a new index takes the newest shape
            target = self._open(topic, source, self.schema_for(topic), generation)
            self._check_fingerprint(target, following)
            self._targets[(topic, generation)] = target
        schema = self._moved(topic, source, target)
        if schema is not None:
            self._evolve(target, schema)
        return target

    def ready(self, topic: str, source: dict, generation: int) -> bool:
        """Whether ``prepare`` would only hand back the index: made already, in the shape the rows
        name (nothing to create or change before their documents go out)."""
        target = self._targets.get((topic, generation))
        return target is not None and self._moved(topic, source, target) is None

    def _moved(self, topic: str, source: dict, target: Target) -> dict | None:
        """The schema record the rows of ``source`` were written under (the runtime hands one per
        topic and write; rows that name none, of older sources, are taken in the newest shape)
        when the index does not follow it yet; else None."""
        version = source.get("schema_version")
        schema = self.schema_for(topic, version) if version is not None else self.schema_for(topic)
        if schema is not None and _changed(schema, target.meta, named=version is not None):
            return schema
        return None

    def _layout(self, topic: str, source: dict, schema: dict | None) -> tuple[str, TableLayout]:
        block = dict(source)
        if schema is not None:
            block = {"schema": schema.get("schema"), "db": schema.get("db"), "table": schema.get("table"), **{
                k: v for k, v in source.items() if v}}
        alias = alias_name(self.config.index_name, topic, block)
        qualified = f"{block.get('schema') or block.get('db') or ''}.{block.get('table') or topic.rsplit('.', 1)[-1]}"
        return alias, TableLayout.for_table(self.config.tables, qualified)

    def _shape(self, layout: TableLayout, schema: dict | None) -> Shape:
        columns = schema.get("columns") if schema is not None else None
        names = [c["name"] for c in columns] if columns else []
        return shape_of(columns, layout.field_names(names), layout.options.mappings)

    def _fingerprint(self, layout: TableLayout) -> str:
        return fingerprint(layout.options.model_dump(mode="json"), self.config.settings)

    def _open(self, topic: str, source: dict, schema: dict | None, generation: int) -> Target:
        alias, layout = self._layout(topic, source, schema)
        shape = self._shape(layout, schema)
        meta = {"sink": self.config.name, "topic": topic, "fingerprint": self._fingerprint(layout),
                "schema_version": schema.get("version") if schema is not None else None,
                "columns": columns_fingerprint(schema)}
        settings = _merge(self.config.settings, layout.options.settings)
        if generation != self.generations.state.current:
            # A generation being filled: nobody reads it before the switch, which sets the
            # user's refresh_interval back first (finish_fill) and refreshes it. Until then no
            # segment is written every second: a refresh per second cost the node a fifth to a
            # quarter of its CPU per document in a bulk fill (bench/opensearch_sink.py).
            settings = with_refresh(settings, FILLING_REFRESH)
        body = {"settings": settings, "mappings": {**shape.mappings, "_meta": {"cdc": meta}}}
        index = generation_index(alias, generation)
        if self.generations.ensure_index(alias, topic, generation, body):
            return Target(alias, topic, index, generation, layout, dict(shape.properties), meta)
        mapping = self.client.indices.get_mapping(index=index)[index]["mappings"]
        return Target(alias, topic, index, generation, layout, mapping.get("properties", {}),
                      mapping.get("_meta", {}).get("cdc", {}))

    def finish_fill(self, alias: str, topic: str, generation: int) -> None:
        """Before readers are switched to ``generation``: its index of ``topic`` takes the
        refresh_interval of the user's settings again (None: OpenSearch's default)."""
        target = self._targets.get((topic, generation))
        layout = target.layout if target is not None else self._layout(topic, {}, self.schema_for(topic))[1]
        refresh_back(self.client, generation_index(alias, generation),
                     _merge(self.config.settings, layout.options.settings))

    def _check_fingerprint(self, target: Target, following: bool) -> None:
        wanted = self._fingerprint(target.layout)
        if following and target.meta.get("fingerprint") not in (None, wanted):
            raise RebuildRequired(f"opensearch sink {self.config.name}: {target.alias}: the config's columns, "
                                  f"renames, mappings or settings for it changed; only a new index can take them")

    def _evolve(self, target: Target, schema: dict) -> None:
        wanted = self._shape(target.layout, schema)
        diff = compare(target.properties, wanted.properties)
        if diff.changed and self.config.schema_policy != "ignore":
            changes = ", ".join(f"{name}: {live.get('type', 'object')} -> {new.get('type', 'object')}"
                                for name, (live, new) in sorted(diff.changed.items()))
            message = (f"opensearch sink {self.config.name}: {target.alias}: the source's schema version "
                       f"{schema.get('version')} changes fields the index cannot change ({changes})")
            if self.config.schema_policy == "rebuild":
                raise RebuildRequired(message + "; rebuilding into a new generation")
            raise SchemaChangeError(message + "; run `cdc rebuild`, or set schema_policy: rebuild or ignore")
        if diff.changed:
            log.warning("opensearch sink %s: %s: fields %s changed type in the source; schema_policy ignore: "
                        "documents the index refuses go to the dead letters", self.config.name, target.alias,
                        sorted(diff.changed))
        target.meta = {**target.meta, "schema_version": schema.get("version"), "columns": columns_fingerprint(schema)}
        body: dict[str, Any] = {"_meta": {"cdc": target.meta}}
        if diff.added:
            body["properties"] = diff.added
            if not wanted.dynamic:
                body["dynamic"] = False
            log.info("opensearch sink %s: %s: fields added to the mapping: %s", self.config.name, target.index,
                     sorted(diff.added))
        self.client.indices.put_mapping(index=target.index, body=body)
        target.properties.update(diff.added)

    def check_refused(self, indexes: set[str]) -> None:
        """Documents were refused: if the table's schema moved meanwhile, that is the reason (and
        the policy answers it), not the documents."""
        for target in list(self._targets.values()):
            if target.index in indexes and (schema := self.schema_for(target.topic)) is not None:
                if _changed(schema, target.meta, named=False):
                    self._evolve(target, schema)

    # -- truncates, empty indexes, status --------------------------------------------------------
    def truncate(self, target: Target, version: int) -> None:
        if target.truncated_before is not None and target.truncated_before >= version:
            return
        self.client.indices.refresh(index=target.index)
        answer = self.client.delete_by_query(index=target.index, body={
            "query": {"range": {VERSION_FIELD: {"lt": version}}}}, params={"conflicts": "proceed",
                                                                           "refresh": "true"})
        target.meta = {**target.meta, "truncated_before": version}
        self.client.indices.put_mapping(index=target.index, body={"_meta": {"cdc": target.meta}})
        log.info("opensearch sink %s: %s truncated: %s documents older than version %d deleted",
                 self.config.name, target.index, answer.get("deleted"), version)

    def create_empty(self, alias: str, topic: str, generation: int) -> None:
        schema = self.schema_for(topic)
        target = self._open(topic, {}, schema, generation)
        self._targets[(topic, generation)] = target

    def current_indexes(self) -> list[tuple[str, str]]:
        """(topic, index) of the generation readers see."""
        state = self.generations.state
        return [(topic, generation_index(alias, state.current)) for alias, topic in sorted(state.aliases.items())]

    def describe(self) -> list[dict]:
        state = self.generations.state
        rows = []
        for alias, topic in sorted(state.aliases.items()):
            index = generation_index(alias, state.current)
            documents = self.client.count(index=alias, params={"ignore_unavailable": "true"}).get("count")
            tombstones = self.client.count(index=index, body={"query": {"term": {DELETED_FIELD: True}}},
                                           params={"ignore_unavailable": "true"}).get("count")
            rows.append({"alias": alias, "topic": topic, "index": index, "generation": state.current,
                         "documents": documents, "tombstones": tombstones})
        return rows


    def documents(self, topic: str) -> list[tuple[str, dict]]:
        """(document id, source) of every document readers see for ``topic`` (its alias hides the
        tombstones), bookkeeping fields left out; none when the sink made no index for it."""
        alias = next((a for a, t in self.generations.stored_aliases().items() if t == topic), None)
        if alias is None or not self.client.indices.exists_alias(name=alias):
            return []
        self.client.indices.refresh(index=alias)  # everything written so far, not only what a refresh showed
        out: list[tuple[str, dict]] = []
        answer = self.client.search(index=alias, body={"size": 5000, "sort": ["_doc"]}, params={"scroll": "1m"})
        try:
            while answer["hits"]["hits"]:
                out.extend((hit["_id"], {k: v for k, v in hit["_source"].items() if not k.startswith("__cdc_")})
                           for hit in answer["hits"]["hits"])
                answer = self.client.scroll(scroll_id=answer["_scroll_id"], params={"scroll": "1m"})
        finally:
            self.client.clear_scroll(scroll_id=answer["_scroll_id"])
        return out


def _changed(schema: dict, meta: dict, *, named: bool) -> bool:
    """Whether ``schema`` may change the index. Rows that name their shape (``named``): only a
    newer one does; rows of an older one (a rebuild replaying the topic from its start into an
    index made in the newest shape) are written as they are. Rows that name none get the newest
    shape, which changes the index when its columns differ from those it was made from (such
    sources may publish shapes without increasing versions)."""
    if named:
        known = meta.get("schema_version")
        return known is None or (schema.get("version") or 0) > known
    return columns_fingerprint(schema) != meta.get("columns")


def columns_fingerprint(schema: dict | None) -> str | None:
    return fingerprint(schema.get("columns")) if schema is not None else None


FILLING_REFRESH = "-1"  # no periodic refresh while a generation nobody reads is filled


def refresh_back(client: Any, index: str, settings: dict) -> None:
    """A filled generation's ``index`` takes the refresh_interval of ``settings`` (the user's)
    again, or OpenSearch's default where they name none."""
    client.indices.put_settings(index=index, body={"index": {"refresh_interval": _user_refresh(settings)}})


def _user_refresh(settings: dict) -> Any:
    """The refresh_interval the user's settings name, in any of their spellings (None: none)."""
    index = settings.get("index")
    if isinstance(index, dict) and index.get("refresh_interval") is not None:
        return index["refresh_interval"]
    return settings.get("index.refresh_interval", settings.get("refresh_interval"))


def with_refresh(settings: dict, value: str) -> dict:
    """``settings`` with refresh_interval ``value``, whichever spelling the user chose left out."""
    settings = {k: v for k, v in settings.items() if k not in ("index.refresh_interval", "refresh_interval")}
    index = settings.get("index")
    index = {k: v for k, v in index.items() if k != "refresh_interval"} if isinstance(index, dict) else {}
    return {**settings, "index": {**index, "refresh_interval": value}}


def _merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged
