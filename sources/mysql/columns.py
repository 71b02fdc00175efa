"""The columns of a binlog table map: MySQL's binlog type codes, ``ColumnSpec`` (one column as the
table map describes it, read by ``specs_from_table_map``) and how a string column's bytes become
its value. The row decoders (``decoder``, ``c_decoder``) are generated from these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from cdc.errors import PrerequisiteError
from sources.mysql.types import _decode_mysql_latin1, b64, parse_json, python_codec

# Binlog column type codes (include/mysql_com.h enum_field_types).
DECIMAL, TINY, SHORT, LONG, FLOAT, DOUBLE, NULL, TIMESTAMP, LONGLONG, INT24 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9
DATE, TIME, DATETIME, YEAR, NEWDATE, VARCHAR, BIT, TIMESTAMP2, DATETIME2, TIME2 = 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
JSON, NEWDECIMAL, ENUM, SET, TINY_BLOB, MEDIUM_BLOB, LONG_BLOB, BLOB, VAR_STRING, STRING, GEOMETRY = (
    245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255)

TYPE_NAMES = {TINY: "tinyint", SHORT: "smallint", INT24: "mediumint", LONG: "int", LONGLONG: "bigint",
              FLOAT: "float", DOUBLE: "double", NEWDECIMAL: "decimal", YEAR: "year", DATE: "date",
              TIME: "time", TIME2: "time", DATETIME: "datetime", DATETIME2: "datetime",
              TIMESTAMP: "timestamp", TIMESTAMP2: "timestamp", VARCHAR: "varchar", VAR_STRING: "varchar",
              STRING: "char", ENUM: "enum", SET: "set", BIT: "bit", BLOB: "blob", GEOMETRY: "geometry",
              JSON: "json"}


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One column as the table map describes it (with ``binlog_row_metadata=FULL``)."""

    name: str
    type: int                      # binlog type code; STRING's real type (ENUM/SET) resolved
    nullable: bool = True
    unsigned: bool = False
    length: int = 0                # VARCHAR/STRING: max bytes; BLOB/GEOMETRY/JSON: length-prefix bytes;
                                   # ENUM/SET: storage bytes; BIT: bits
    precision: int = 0             # DECIMAL
    scale: int = 0                 # DECIMAL
    fsp: int = 0                   # TIME2/DATETIME2/TIMESTAMP2 fractional digits
    charset: str | None = None     # MySQL character set of text columns; "binary" for binary strings
    labels: tuple[str, ...] = ()   # ENUM/SET labels in definition order
    json: bool = False             # MariaDB JSON (a LONGTEXT with json_valid): parsed

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ColumnSpec:
        return cls(**{**data, "labels": tuple(data.get("labels") or ())})

    @property
    def type_name(self) -> str:
        """A readable type for schema records: ``decimal(10,2)``, ``int unsigned``, ``datetime(3)``."""
        base = "json" if self.json else TYPE_NAMES.get(self.type, f"type{self.type}")
        if self.type == NEWDECIMAL:
            base += f"({self.precision},{self.scale})"
        elif self.type in (TIME2, DATETIME2, TIMESTAMP2) and self.fsp:
            base += f"({self.fsp})"
        elif self.type in (ENUM, SET):
            base += "(" + ",".join("'" + label.replace("'", "''") + "'" for label in self.labels) + ")"
        elif self.type == BIT:
            base += f"({self.length})"
        elif self.type in (VARCHAR, VAR_STRING, STRING) and self.charset == "binary":
            base = ("binary" if self.type == STRING else "varbinary") + f"({self.length})"
        elif self.type in (VARCHAR, VAR_STRING, STRING):
            base += f"({self.length} bytes)"
        elif self.type == BLOB and not self.json:
            kind = ("tiny", "", "medium", "long")[min(max(self.length, 1), 4) - 1]
            base = kind + ("blob" if self.charset == "binary" else "text")
        if self.unsigned:
            base += " unsigned"
        return base


def string_converter(s: ColumnSpec) -> str | Callable[[bytes], Any]:
    """How a string column's bytes become its value: a Python codec name (``str(raw, codec)``) or
    a function of the bytes. The generated decoders and the C decoder both follow it."""
    if s.json:
        return parse_json
    if s.charset == "binary" or s.type == GEOMETRY:
        if s.type == STRING and s.length:  # BINARY(n): the binlog drops the trailing zero bytes
            width = s.length
            return lambda raw: b64(raw.ljust(width, b"\0"))
        return b64
    if s.charset is None:
        raise PrerequisiteError(f"column {s.name}: the table map has no character set for it "
                                "(binlog_row_metadata must be FULL)")
    return python_codec(s.charset) or _decode_mysql_latin1


def specs_from_table_map(event: Any, dbms: str, json_columns: set[str]) -> list[ColumnSpec]:
    """ColumnSpecs from a pymysqlreplication ``TableMapEvent`` (its columns and optional metadata)."""
    metadata = event.optional_metadata
    charsets = list(metadata.charset_collation_list or [])
    null_bits = event.null_bitmask
    from sources.mysql.types import charset_name

    specs = []
    char_index = 0
    for i, column in enumerate(event.columns):
        t = column.type
        charset = None
        if t in (STRING, VAR_STRING, VARCHAR, BLOB) or (t == GEOMETRY and dbms == "mariadb"):
            if char_index < len(charsets):
                charset = charset_name(charsets[char_index])
            char_index += 1
        if t in (VARCHAR, VAR_STRING, STRING):
            length = column.max_length
        elif t in (BLOB, GEOMETRY, JSON):
            length = column.length_size
        elif t in (ENUM, SET):
            length = column.size
        elif t == BIT:
            length = column.bits
        else:
            length = 0
        labels = tuple(column.enum_values[1:] if t == ENUM and column.enum_values
                       else column.set_values if t == SET and column.set_values else ())
        specs.append(ColumnSpec(
            name=column.name or "", type=t, nullable=bool(null_bits[i >> 3] & (1 << (i & 7))),
            unsigned=bool(column.unsigned), length=length,
            precision=getattr(column, "precision", 0) if t == NEWDECIMAL else 0,
            scale=getattr(column, "decimals", 0) if t == NEWDECIMAL else 0,
            fsp=getattr(column, "fsp", 0) if t in (TIME2, DATETIME2, TIMESTAMP2) else 0,
            charset=charset, labels=labels, json=column.name in json_columns and t == BLOB))
    return specs
