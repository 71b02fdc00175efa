"""One converter per column: built once from the column's type OID, then applied to every value.

``converter_for`` picks by OID for built-in scalars and by catalog kind for the rest (domains
convert as their base type, enums as their label, arrays element by element, ranges and
multiranges bound by bound, hstore by name, composites and unknown types as text). Snapshot (COPY)
and stream (pgoutput) hand the same text to the same converter, so their JSON is the same by
construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdc.errors import DecodeError
from sources.postgres.types.arrays import array_converter
from sources.postgres.types.catalog import BUILTIN_TYPES, TypeInfo, TypeKind
from sources.postgres.types.hstore import hstore_to_dict
from sources.postgres.types.ranges import multirange_converter, range_converter
from sources.postgres.types.scalars import SCALAR_CONVERTERS, Converter, as_text

_MAX_DEPTH = 16  # a domain over an array of a range ...: deeper than this is a broken catalog


def _lookup(oid: int, catalog: Mapping[int, TypeInfo]) -> TypeInfo | None:
    info = catalog.get(oid)
    return info if info is not None else BUILTIN_TYPES.get(oid)


def converter_for(type_oid: int, catalog: Mapping[int, TypeInfo], _depth: int = 0) -> Converter:
    """The function from ``type_oid``'s text output to its JSON-ready value (for non-NULL values).

    ``catalog`` comes from ``load_type_catalog`` (built-in types need no entry). Converters raise
    ``ValueError``/``KeyError``/``DecodeError`` on text their type cannot print; ``convert_row``
    turns those into a ``DecodeError`` that names the column.
    """
    if _depth > _MAX_DEPTH:
        raise DecodeError(f"type {type_oid}: nested more than {_MAX_DEPTH} levels deep")
    scalar = SCALAR_CONVERTERS.get(type_oid)
    if scalar is not None:
        return scalar
    info = _lookup(type_oid, catalog)
    if info is None:
        return as_text
    kind = info.kind
    if kind is TypeKind.DOMAIN:
        return converter_for(info.base_oid, catalog, _depth + 1)
    if kind is TypeKind.ARRAY:
        element = _lookup(info.element_oid, catalog)
        delimiter = element.delimiter if element is not None else info.delimiter
        return array_converter(converter_for(info.element_oid, catalog, _depth + 1), delimiter)
    if kind is TypeKind.RANGE:
        return range_converter(converter_for(info.range_subtype_oid, catalog, _depth + 1))
    if kind is TypeKind.MULTIRANGE:
        return multirange_converter(converter_for(info.range_subtype_oid, catalog, _depth + 1))
    if kind is TypeKind.BASE and info.name == "hstore":
        return hstore_to_dict
    return as_text  # enums (their label), composites, every other base type


def convert_row(columns: Sequence[tuple[str, Converter]], texts: Sequence[str | None]) -> dict[str, Any]:
    """``{name: value}`` for one row's texts (``None`` is SQL NULL), in column order.

    Raises ``DecodeError`` naming the column whose text its converter refused, or a count mismatch.
    """
    try:
        return {name: None if text is None else convert(text)
                for (name, convert), text in zip(columns, texts, strict=True)}
    except (ValueError, KeyError, IndexError, TypeError, DecodeError) as err:
        if len(columns) != len(texts):
            raise DecodeError(f"row has {len(texts)} values for {len(columns)} columns") from err
        for (name, convert), text in zip(columns, texts):
            if text is None:
                continue
            try:
                convert(text)
            except (ValueError, KeyError, IndexError, TypeError, DecodeError) as col_err:
                raise DecodeError(f"column {name}: cannot convert {text[:200]!r}: {col_err}") from col_err
        raise DecodeError(f"row cannot be converted: {err}") from err
