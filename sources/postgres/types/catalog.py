"""What the converters need to know about a column's type, from ``pg_type`` and ``pg_range``.

A ``TypeInfo`` says which family a type belongs to (base, domain, enum, range, multirange,
composite, array) and which other type its values are made of. ``load_type_catalog`` reads these
for a table's column types and, recursively, for the types they refer to (a domain's base, an
array's element, a range's subtype), so ``converter_for`` can build nested converters without
further queries. Built-in types are also known without a catalog (``BUILTIN_TYPES``): OIDs below
10000 are fixed across servers and versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class TypeKind(StrEnum):
    BASE = "base"
    DOMAIN = "domain"
    ENUM = "enum"
    RANGE = "range"
    MULTIRANGE = "multirange"
    COMPOSITE = "composite"
    ARRAY = "array"


@dataclass(frozen=True, slots=True)
class TypeInfo:
    oid: int
    name: str                    # pg_type.typname, e.g. "int4", "_int4", "hstore"
    kind: TypeKind
    element_oid: int = 0         # arrays: the element type; multiranges: their range type
    base_oid: int = 0            # domains: the underlying type
    range_subtype_oid: int = 0   # ranges and multiranges: the bound type
    delimiter: str = ","         # pg_type.typdelim: separates values of this type inside an array
    schema: str = "pg_catalog"


# Built-in scalars: name -> (oid, array oid). Names follow pg_type.typname.
_BUILTIN_SCALARS: dict[str, tuple[int, int]] = {
    "bool": (16, 1000), "bytea": (17, 1001), "char": (18, 1002), "name": (19, 1003),
    "int8": (20, 1016), "int2": (21, 1005), "int2vector": (22, 1006), "int4": (23, 1007),
    "text": (25, 1009), "oid": (26, 1028), "tid": (27, 1010), "xid": (28, 1011), "cid": (29, 1012),
    "oidvector": (30, 1013), "json": (114, 199), "xml": (142, 143), "point": (600, 1017),
    "lseg": (601, 1018), "path": (602, 1019), "box": (603, 1020), "polygon": (604, 1027),
    "line": (628, 629), "cidr": (650, 651), "float4": (700, 1021), "float8": (701, 1022),
    "circle": (718, 719), "macaddr8": (774, 775), "money": (790, 791), "macaddr": (829, 1040),
    "inet": (869, 1041), "bpchar": (1042, 1014), "varchar": (1043, 1015), "date": (1082, 1182),
    "time": (1083, 1183), "timestamp": (1114, 1115), "timestamptz": (1184, 1185),
    "interval": (1186, 1187), "timetz": (1266, 1270), "bit": (1560, 1561), "varbit": (1562, 1563),
    "numeric": (1700, 1231), "refcursor": (1790, 2201), "uuid": (2950, 2951),
    "txid_snapshot": (2970, 2949), "pg_lsn": (3220, 3221), "tsvector": (3614, 3643),
    "tsquery": (3615, 3645), "jsonb": (3802, 3807), "jsonpath": (4072, 4073),
    "pg_snapshot": (5038, 5039), "xid8": (5069, 271),
}
# Built-in ranges: name -> (oid, array oid, subtype oid, multirange name, multirange oid, its array oid).
_BUILTIN_RANGES: dict[str, tuple[int, int, int, str, int, int]] = {
    "int4range": (3904, 3905, 23, "int4multirange", 4451, 6150),
    "numrange": (3906, 3907, 1700, "nummultirange", 4532, 6151),
    "tsrange": (3908, 3909, 1114, "tsmultirange", 4533, 6152),
    "tstzrange": (3910, 3911, 1184, "tstzmultirange", 4534, 6153),
    "daterange": (3912, 3913, 1082, "datemultirange", 4535, 6155),
    "int8range": (3926, 3927, 20, "int8multirange", 4536, 6157),
}


def _builtin_types() -> dict[int, TypeInfo]:
    types: dict[int, TypeInfo] = {}

    def add(info: TypeInfo, array_oid: int) -> None:
        types[info.oid] = info
        types[array_oid] = TypeInfo(array_oid, "_" + info.name, TypeKind.ARRAY, element_oid=info.oid,
                                    delimiter=info.delimiter)

    for name, (oid, array_oid) in _BUILTIN_SCALARS.items():
        add(TypeInfo(oid, name, TypeKind.BASE, delimiter=";" if name == "box" else ","), array_oid)
    for name, (oid, array_oid, subtype, multi_name, multi_oid, multi_array) in _BUILTIN_RANGES.items():
        add(TypeInfo(oid, name, TypeKind.RANGE, range_subtype_oid=subtype), array_oid)
        add(TypeInfo(multi_oid, multi_name, TypeKind.MULTIRANGE, element_oid=oid, range_subtype_oid=subtype),
            multi_array)
    return types


BUILTIN_TYPES: dict[int, TypeInfo] = _builtin_types()

_KINDS = {"b": TypeKind.BASE, "p": TypeKind.BASE, "d": TypeKind.DOMAIN, "e": TypeKind.ENUM,
          "r": TypeKind.RANGE, "m": TypeKind.MULTIRANGE, "c": TypeKind.COMPOSITE}
# int2vector and oidvector look like arrays in pg_type but print as '1 2 3': kept as text.
_NOT_ARRAYS = frozenset({22, 30})

_TYPES_SQL = """
SELECT t.oid, t.typname, n.nspname, t.typtype, t.typcategory, t.typelem, t.typlen, t.typbasetype,
       t.typdelim, r.rngsubtype, {multirange_range}
FROM pg_type t
JOIN pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_range r ON r.rngtypid = t.oid
{multirange_join}
WHERE t.oid = ANY(%s::oid[])
"""
# pg_range.rngmultitypid exists from PostgreSQL 14, with multiranges.
_TYPES_SQL_14 = _TYPES_SQL.format(multirange_range="mr.rngtypid, mr.rngsubtype",
                                  multirange_join="LEFT JOIN pg_range mr ON mr.rngmultitypid = t.oid")
_TYPES_SQL_OLD = _TYPES_SQL.format(multirange_range="NULL::oid, NULL::oid", multirange_join="")


def _type_info(row: tuple) -> TypeInfo:
    (oid, name, schema, typtype, category, elem, typlen, basetype, delim, subtype,
     multi_range, multi_subtype) = row
    oid, elem = int(oid), int(elem)
    if typtype == "b" and category == "A" and elem and typlen == -1 and oid not in _NOT_ARRAYS:
        return TypeInfo(oid, name, TypeKind.ARRAY, element_oid=elem, delimiter=delim, schema=schema)
    kind = _KINDS.get(typtype, TypeKind.BASE)
    if kind is TypeKind.DOMAIN:
        return TypeInfo(oid, name, kind, base_oid=int(basetype), delimiter=delim, schema=schema)
    if kind is TypeKind.RANGE:
        return TypeInfo(oid, name, kind, range_subtype_oid=int(subtype), delimiter=delim, schema=schema)
    if kind is TypeKind.MULTIRANGE:
        return TypeInfo(oid, name, kind, element_oid=int(multi_range or 0),
                        range_subtype_oid=int(multi_subtype or 0), delimiter=delim, schema=schema)
    return TypeInfo(oid, name, kind, delimiter=delim, schema=schema)


def _referenced(info: TypeInfo) -> Iterable[int]:
    return (oid for oid in (info.element_oid, info.base_oid, info.range_subtype_oid) if oid)


def load_type_catalog(conn, oids: Iterable[int]) -> dict[int, TypeInfo]:
    """``TypeInfo`` for ``oids`` and every type they are built from, read from the server.

    ``conn`` is an ordinary psycopg2 connection (not a replication one). One query per level of
    nesting (a domain over an array of a range: four); the transaction is left to the caller, so
    this can run inside a snapshot's transaction. OIDs the server does not know are left out;
    ``converter_for`` then keeps their values as text.
    """
    with conn.cursor() as cur:
        cur.execute("SHOW server_version_num")
        sql = _TYPES_SQL_14 if int(cur.fetchone()[0]) >= 140000 else _TYPES_SQL_OLD
        catalog: dict[int, TypeInfo] = {}
        pending = {int(oid) for oid in oids}
        asked: set[int] = set()
        while pending:
            cur.execute(sql, (sorted(pending),))
            found = [_type_info(row) for row in cur.fetchall()]
            asked |= pending
            catalog.update((info.oid, info) for info in found)
            pending = {oid for info in found for oid in _referenced(info) if oid not in asked}
    return catalog
