"""What a table must do to follow its source's shape: columns to add, types to widen, values to cast.

First the renames: a source column that once had the name of a column the table has (its
``renamed_from``, chained over the shapes the table skipped: ``TableShape.earlier``), while the
table lacks the new name and the shape the old one, is renamed in place (``ALTER TABLE ... RENAME
COLUMN``, through Delta's column mapping): its values stay, under the new name. Then, for each
source column:

* not in the table: added (nullable; older rows read NULL);
* its values fit the column's type without loss (``types.fits``: the same type, anything into a
  text column, a decimal into a wider one): kept, the values are cast;
* the column can be widened in place (``types.widening``: a decimal that grows, a date to
  timestamp_ntz): widened through Delta's type widening (a metadata change);
* a decimal or bigint that becomes an 8-byte float (``types.recast``): the source rounded each
  value to the nearest double, without logging the rows; ``evolve`` casts the table's values the
  same way, by rewriting the table in one commit (Delta cannot widen these), the other policies
  take it for incompatible;
* anything else (text to a number, a narrower decimal, a number to a date): incompatible.

A table column the source no longer has stays, and new rows hold NULL in it. A different key is
incompatible: the table's rows are keyed by the old key's JSON and could never be matched again.
Incompatible changes follow the sink's ``schema_policy``: ``fail`` (``SchemaChangeError``) or
``rebuild`` (the table is rebuilt from its compacted topic with the new shape). A rename stops a
``fail`` sink and is made in place by the others (a rebuild could not help: the compacted topic
holds the older rows under the old name).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import types as T

from cdc.api import renames_to_follow
from spark_sinks.parse import PREFIX
from spark_sinks.schemas import TableShape
from spark_sinks.types import fits, recast, widening


@dataclass
class Plan:
    add: list[T.StructField] = field(default_factory=list)
    rename: list[tuple[str, str]] = field(default_factory=list)     # (the table's old name, new name)
    # new name -> the names the column had in the shapes the table skipped, newest first
    passed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    widen: list[tuple[str, T.DataType]] = field(default_factory=list)
    # (the table's column, its new type): the source's own cast of a decimal or bigint into a
    # double (types.recast), which the table can replay on its values by a rewrite; ``evolve``
    # does, the other policies take it for an incompatible change (``incompatible_recast``)
    recast: list[tuple[str, T.DataType]] = field(default_factory=list)
    casts: dict[str, T.DataType] = field(default_factory=dict)   # source column -> the table's type
    incompatible: list[str] = field(default_factory=list)        # why, one entry per problem

    @property
    def changes_table(self) -> bool:
        return bool(self.add or self.widen or self.rename or self.recast)

    def incompatible_recast(self, table_schema: T.StructType) -> None:
        """Take the recasts for incompatible changes (a policy other than ``evolve``)."""
        types = {f.name: f.dataType for f in table_schema.fields}
        self.incompatible += [f"column {name}: {types[name].simpleString()} -> {kind.simpleString()} (the "
                              f"source's cast, which schema_policy: evolve makes on the table's values too)"
                              for name, kind in self.recast]
        self.recast = []


def data_fields(schema: T.StructType) -> list[T.StructField]:
    return [f for f in schema.fields if not f.name.startswith(PREFIX)]


def plan(shape: TableShape, table_schema: T.StructType, table_key: tuple[str, ...] | None) -> Plan:
    """How the table with ``table_schema`` (data and bookkeeping columns) and key ``table_key``
    follows ``shape``."""
    out = Plan()
    existing = {f.name.lower(): f for f in data_fields(table_schema)}
    if table_key is not None and tuple(k.lower() for k in table_key) != tuple(k.lower() for k in shape.key):
        out.incompatible.append(f"the key changed from ({', '.join(table_key)}) to ({', '.join(shape.key)})")
    earlier = {name: () for name in shape.names} | dict(shape.earlier)
    for new, (old, passed) in renames_to_follow(earlier, [f.name for f in existing.values()], str.lower).items():
        column = existing.pop(old.lower())
        out.rename.append((old, new))
        if passed:
            out.passed[new] = passed
        existing[new.lower()] = T.StructField(new, column.dataType, column.nullable)
    for name, kind in shape.columns:
        present = existing.get(name.lower())
        if present is None:
            out.add.append(T.StructField(name, kind, True))
        elif present.dataType == kind:
            continue
        elif fits(kind, present.dataType):
            out.casts[name] = present.dataType
        elif widening(present.dataType, kind):
            out.widen.append((present.name, kind))
        elif recast(present.dataType, kind) and name in shape.doubles:
            out.recast.append((present.name, kind))
        else:
            out.incompatible.append(f"column {name}: {kind.simpleString()} values do not fit the table's "
                                    f"{present.dataType.simpleString()}")
    return out
