"""Just enough of MySQL's DDL grammar to follow a table's columns through the binlog.

Why parse at all: a row event's table map names every column and type (``binlog_row_metadata=
FULL``), so rows always decode with the right columns. What it does not carry is what the schema
record needs (the declared type, NOT NULL) and, on MariaDB, which LONGTEXT columns are JSON. The
catalog only knows the *current* definitions, which are wrong for a stream that is behind a later
ALTER; the statement in the binlog is right at its point in the stream. So the source applies
each DDL statement to its own copy of the table definitions (``schema.py``).

Covered: CREATE TABLE (column list, LIKE, ... SELECT), ALTER TABLE (ADD/DROP/MODIFY/CHANGE/RENAME
COLUMN, ADD/DROP PRIMARY KEY, RENAME TO), RENAME TABLE, DROP TABLE, TRUNCATE. Anything else that
names a table is ``Unparsed``: the source then takes that table's shape from its next table map
(and the catalog), so a statement this module does not understand costs precision, not rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sources.mysql.types import BINARY_TYPES, ColumnType

_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<id>`(?:[^`]|``)*`)
  | (?P<str>'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*")
  | (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<word>[A-Za-z_$\x80-\uffff][\w$\x80-\uffff]*)
  | (?P<p>.)
""", re.X | re.S)
_VERSIONED = re.compile(r"/\*[!M]!?\d*(.*?)\*/", re.S)
_DISPLAY_WIDTH = re.compile(r"^(tinyint|smallint|mediumint|int|integer|bigint|year)\(\d+\)")


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str     # id (quoted or bare word), str, num, p
    text: str     # raw text
    value: str    # identifier without quotes; upper-cased for bare words in ``upper``
    upper: str


def tokenize(sql: str) -> list[Tok]:
    sql = _VERSIONED.sub(r" \1 ", sql)
    tokens = []
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup
        assert kind is not None, "every alternative of _TOKEN is a named group"
        text = match.group()
        if kind == "ws":
            continue
        if kind == "id":
            tokens.append(Tok("id", text, text[1:-1].replace("``", "`"), ""))
        elif kind == "word":
            tokens.append(Tok("id", text, text, text.upper()))
        else:
            tokens.append(Tok(kind, text, text, text))
    return tokens


@dataclass(frozen=True, slots=True)
class ColumnDef:
    name: str
    type: ColumnType
    nullable: bool
    primary: bool = False

    @property
    def type_name(self) -> str:
        return "json" if self.type.json else self.type.column_type

    def as_json(self) -> ColumnDef:
        return ColumnDef(self.name, ColumnType(self.type.data_type, self.type.column_type, self.type.fsp, True,
                                               self.type.binary, self.type.length), self.nullable, self.primary)


# The statements, as the changes they make.
@dataclass(frozen=True, slots=True)
class CreateTable:
    db: str
    table: str
    columns: tuple[ColumnDef, ...]
    key: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CreateTableLike:
    db: str
    table: str
    source: tuple[str, str]


@dataclass(frozen=True, slots=True)
class AlterTable:
    db: str
    table: str
    ops: tuple = ()
    rename_to: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class RenameTables:
    pairs: tuple[tuple[tuple[str, str], tuple[str, str]], ...]


@dataclass(frozen=True, slots=True)
class DropTables:
    tables: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    db: str
    table: str


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A statement on this table whose effect on the columns is not known."""
    db: str
    table: str


# ALTER TABLE operations
@dataclass(frozen=True, slots=True)
class AddColumn:
    column: ColumnDef
    after: str | None = None      # "" for FIRST, None for last


@dataclass(frozen=True, slots=True)
class DropColumn:
    name: str


@dataclass(frozen=True, slots=True)
class ChangeColumn:
    old: str
    column: ColumnDef
    after: str | None = None
    move: bool = False


@dataclass(frozen=True, slots=True)
class RenameColumn:
    old: str
    new: str


@dataclass(frozen=True, slots=True)
class SetPrimaryKey:
    columns: tuple[str, ...]      # () drops it


class _Parser:
    def __init__(self, tokens: list[Tok], default_db: str) -> None:
        self.t = tokens
        self.i = 0
        self.db = default_db

    def peek(self, ahead: int = 0) -> Tok | None:
        j = self.i + ahead
        return self.t[j] if j < len(self.t) else None

    def peek_upper(self) -> str:
        """The next token's ``upper`` ("" at the end)."""
        tok = self.peek()
        return tok.upper if tok is not None else ""

    def at(self, *words: str) -> bool:
        for k, word in enumerate(words):
            tok = self.peek(k)
            if tok is None or (tok.upper != word and tok.text != word):
                return False
        return True

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.i += len(words)
            return True
        return False

    def take(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of statement")
        self.i += 1
        return tok

    def name(self) -> tuple[str, str]:
        first = self.take().value
        if self.accept("."):
            return first, self.take().value
        return self.db, first

    def group(self) -> list[Tok]:
        """The tokens inside the parentheses at the cursor (consumed, parentheses excluded)."""
        if not self.accept("("):
            raise ValueError("expected (")
        depth, start = 1, self.i
        while depth:
            tok = self.take()
            depth += (tok.text == "(") - (tok.text == ")")
        return self.t[start:self.i - 1]

    def element(self) -> list[Tok]:
        """Tokens up to the next top-level comma or closing parenthesis (not consumed)."""
        start, depth = self.i, 0
        while (tok := self.peek()) is not None:
            if depth == 0 and tok.text in (",", ")"):
                break
            depth += (tok.text == "(") - (tok.text == ")")
            self.i += 1
        return self.t[start:self.i]


def _split(tokens: list[Tok]) -> list[list[Tok]]:
    parts: list[list[Tok]] = []
    current: list[Tok] = []
    depth = 0
    for tok in tokens:
        if tok.text == "," and depth == 0:
            parts.append(current)
            current = []
            continue
        depth += (tok.text == "(") - (tok.text == ")")
        current.append(tok)
    if current:
        parts.append(current)
    return parts


def _key_columns(tokens: list[Tok]) -> tuple[str, ...]:
    """``(a, b(10) DESC)`` -> (a, b)."""
    return tuple(part[0].value for part in _split(tokens) if part)


_ATTRIBUTES = {"NOT", "NULL", "DEFAULT", "PRIMARY", "KEY", "UNIQUE", "AUTO_INCREMENT", "COMMENT", "COLLATE",
               "CHARACTER", "CHARSET", "GENERATED", "AS", "CHECK", "REFERENCES", "ON", "INVISIBLE", "VISIBLE",
               "COLUMN_FORMAT", "STORAGE", "WITH", "WITHOUT", "FIRST", "AFTER", "SERIAL", "CONSTRAINT",
               "PERSISTENT", "VIRTUAL", "STORED", "COMPRESSED"}


def column_def(tokens: list[Tok]) -> tuple[ColumnDef, str | None]:
    """A column definition -> (ColumnDef, position): "" for FIRST, a name for AFTER, None else."""
    name = tokens[0].value
    kind = tokens[1].upper.lower()
    k = 2
    args = ""
    if k < len(tokens) and tokens[k].text == "(":
        depth, j = 0, k
        while True:
            depth += (tokens[j].text == "(") - (tokens[j].text == ")")
            j += 1
            if depth == 0:
                break
        args = "(" + ",".join(t.text for t in tokens[k + 1:j - 1] if t.text != ",") + ")"
        k = j
    modifiers = []
    while k < len(tokens) and tokens[k].upper in ("UNSIGNED", "SIGNED", "ZEROFILL", "PRECISION", "VARYING"):
        if tokens[k].upper in ("UNSIGNED", "ZEROFILL"):
            modifiers.append(tokens[k].upper.lower())
        k += 1
    rest = [t.upper for t in tokens[k:]]
    text = _DISPLAY_WIDTH.sub(r"\1", kind + args) + "".join(" " + m for m in modifiers)
    kind = {"integer": "int", "bool": "tinyint", "boolean": "tinyint", "dec": "decimal", "numeric": "decimal",
            "fixed": "decimal", "real": "double", "character": "char", "nchar": "char", "nvarchar": "varchar",
            "long": "mediumtext"}.get(kind, kind)
    charset_binary = any(rest[j] in ("CHARACTER", "CHARSET") and "BINARY" in rest[j + 1:j + 3]
                         for j in range(len(rest)))
    fsp = int(args[1:-1]) if kind in ("datetime", "timestamp", "time") and args[1:-1].isdigit() else 0
    length = int(args[1:-1]) if kind == "binary" and args[1:-1].isdigit() else (1 if kind == "binary" else 0)
    primary = any(rest[j] == "PRIMARY" for j in range(len(rest)))
    nullable = not primary and not any(rest[j] == "NOT" and rest[j + 1:j + 2] == ["NULL"]
                                       for j in range(len(rest)))
    # MariaDB logs a JSON column of CREATE ... SELECT as LONGTEXT ... CHECK (json_valid(`name`)).
    is_json = kind == "json" or any(
        t.upper == "JSON_VALID" and j + 2 < len(tokens) - k and tokens[k + j + 2].value == name
        for j, t in enumerate(tokens[k:]))
    after: str | None = None
    for j, word in enumerate(rest):
        if word == "FIRST":
            after = ""
        elif word == "AFTER" and k + j + 1 < len(tokens):
            after = tokens[k + j + 1].value
    column = ColumnType(kind, text, fsp, json=is_json, binary=kind in BINARY_TYPES or charset_binary,
                        length=length)
    return ColumnDef(name, column, nullable, primary), after


def _create(p: _Parser) -> CreateTable | CreateTableLike | Unparsed | None:
    p.accept("OR", "REPLACE")
    if p.accept("TEMPORARY"):
        return None  # never in a row-based binlog's rows
    if not p.accept("TABLE"):
        return None
    p.accept("IF", "NOT", "EXISTS")
    db, table = p.name()
    if p.accept("LIKE") or p.accept("(", "LIKE"):
        return CreateTableLike(db, table, p.name())
    if not p.at("("):
        return Unparsed(db, table)
    columns: list[ColumnDef] = []
    key: tuple[str, ...] = ()
    json_checked: set[str] = set()
    for part in _split(p.group()):
        head = part[0].upper if part[0].kind == "id" and part[0].text[0] != "`" else ""
        if head == "CONSTRAINT":  # CONSTRAINT [symbol] {PRIMARY KEY | UNIQUE | FOREIGN KEY | CHECK} ...
            part = part[1:]
            if part and part[0].upper not in ("PRIMARY", "UNIQUE", "FOREIGN", "CHECK"):
                part = part[1:]
            head = part[0].upper if part else ""
        if head == "PRIMARY":
            start = next(i for i, t in enumerate(part) if t.text == "(")
            key = _key_columns(_Parser(part[start:], db).group())
        elif head == "CHECK":  # a table-level json_valid(`col`) makes col a JSON column
            json_checked |= {part[i + 2].value for i, t in enumerate(part[:-2]) if t.upper == "JSON_VALID"}
        elif head in ("KEY", "INDEX", "UNIQUE", "FULLTEXT", "SPATIAL", "FOREIGN", "PERIOD"):
            continue
        else:
            columns.append(column_def(part)[0])
    if not key:
        key = tuple(c.name for c in columns if c.primary)
    columns = [c.as_json() if c.name in json_checked else c for c in columns]
    if not columns:
        return Unparsed(db, table)
    if p.accept("SELECT") or p.accept("AS") or p.at("("):
        return Unparsed(db, table)  # CREATE ... SELECT may add the query's columns
    return CreateTable(db, table, tuple(columns), key)


def _alter(p: _Parser) -> AlterTable | Unparsed | None:
    p.accept("ONLINE")
    p.accept("IGNORE")
    if not p.accept("TABLE"):
        return None
    p.accept("IF", "EXISTS")
    db, table = p.name()
    if p.accept("WAIT"):
        p.take()
    p.accept("NOWAIT")
    ops: list = []
    rename_to = None
    for part in _split(p.t[p.i:]):
        q = _Parser(part, db)
        if q.accept("ADD"):
            if q.at("PRIMARY") or (q.at("CONSTRAINT") and any(t.upper == "PRIMARY" for t in part)):
                start = next(i for i, t in enumerate(part) if t.text == "(")
                ops.append(SetPrimaryKey(_key_columns(_Parser(part[start:], db).group())))
                continue
            column = q.accept("COLUMN")
            q.accept("IF", "NOT", "EXISTS")
            if q.at("("):
                ops += [AddColumn(column_def(c)[0]) for c in _split(q.group())]
            elif column or q.peek_upper() not in ("INDEX", "KEY", "UNIQUE", "FULLTEXT", "SPATIAL",
                                                                "FOREIGN", "CONSTRAINT", "PARTITION", "CHECK",
                                                                "PERIOD", "SYSTEM"):
                definition, after = column_def(part[q.i:])
                ops.append(AddColumn(definition, after))
        elif q.accept("DROP"):
            if q.accept("PRIMARY", "KEY"):
                ops.append(SetPrimaryKey(()))
            elif q.accept("COLUMN") or q.peek_upper() not in (
                    "INDEX", "KEY", "FOREIGN", "CONSTRAINT", "PARTITION", "CHECK", "SYSTEM", "PERIOD"):
                q.accept("IF", "EXISTS")
                ops.append(DropColumn(q.take().value))
        elif q.accept("MODIFY"):
            q.accept("COLUMN")
            q.accept("IF", "EXISTS")
            definition, after = column_def(part[q.i:])
            ops.append(ChangeColumn(definition.name, definition, after, after is not None))
        elif q.accept("CHANGE"):
            q.accept("COLUMN")
            q.accept("IF", "EXISTS")
            old = q.take().value
            definition, after = column_def(part[q.i:])
            ops.append(ChangeColumn(old, definition, after, after is not None))
        elif q.accept("RENAME", "COLUMN"):
            old = q.take().value
            q.accept("TO")
            ops.append(RenameColumn(old, q.take().value))
        elif q.accept("RENAME"):
            if q.peek_upper() in ("INDEX", "KEY"):
                continue
            q.accept("TO") or q.accept("AS")
            rename_to = q.name()
        elif q.peek_upper() in ("ENGINE", "COMMENT", "AUTO_INCREMENT", "ALGORITHM", "LOCK", "FORCE",
                                              "ALTER", "ORDER", "ROW_FORMAT", "KEY_BLOCK_SIZE", "DISABLE", "ENABLE",
                                              "DEFAULT", "CHARACTER", "CHARSET", "COLLATE", "CONVERT", "PARTITION",
                                              "REMOVE", "COALESCE", "REORGANIZE", "ANALYZE", "CHECK", "OPTIMIZE",
                                              "REBUILD", "REPAIR", "TRUNCATE", "EXCHANGE", "DISCARD", "IMPORT",
                                              "STATS_PERSISTENT", "STATS_AUTO_RECALC", "STATS_SAMPLE_PAGES",
                                              "PAGE_COMPRESSED", "ENCRYPTED", "TRANSACTIONAL", "WITH", "WITHOUT"):
            continue  # no effect on the columns (CONVERT changes charsets: the table map has them)
        else:
            return Unparsed(db, table)
    return AlterTable(db, table, tuple(ops), rename_to)


def parse(sql: str, default_db: str) -> object | None:
    """The change a DDL statement makes to table definitions; None when it changes no table
    (or is not DDL); ``Unparsed`` for a table whose new shape is not known from the text."""
    tokens = tokenize(sql)
    if not tokens:
        return None
    p = _Parser(tokens, default_db)
    try:
        if p.accept("CREATE"):
            return _create(p)
        if p.accept("ALTER"):
            return _alter(p)
        if p.accept("RENAME", "TABLE") or p.accept("RENAME", "TABLES"):
            pairs = []
            for part in _split(p.t[p.i:]):
                q = _Parser(part, default_db)
                old = q.name()
                q.accept("WAIT") and q.take()
                q.accept("NOWAIT")
                q.accept("TO")
                pairs.append((old, q.name()))
            return RenameTables(tuple(pairs))
        if p.accept("DROP"):
            p.accept("TEMPORARY")
            if not p.accept("TABLE") and not p.accept("TABLES"):
                return None
            p.accept("IF", "EXISTS")
            names = []
            for part in _split(p.t[p.i:]):
                names.append(_Parser(part, default_db).name())
            return DropTables(tuple(names))
        if p.accept("TRUNCATE"):
            p.accept("TABLE")
            return Truncate(*p.name())
    except (ValueError, IndexError, StopIteration):
        # The statement named a table but its shape is beyond this parser.
        p.i = 0
        for word in ("CREATE", "ALTER"):
            if p.accept(word):
                while p.peek() is not None and p.peek_upper() != "TABLE":
                    p.i += 1
                if p.accept("TABLE"):
                    p.accept("IF", "NOT", "EXISTS") or p.accept("IF", "EXISTS")
                    try:
                        return Unparsed(*p.name())
                    except ValueError:
                        return None
        return None
    return None


def normalize_column_type(column_type: str) -> str:
    """information_schema COLUMN_TYPE in the form ``column_def`` writes: no integer display width."""
    return _DISPLAY_WIDTH.sub(r"\1", column_type.lower())


__all__ = ["parse", "tokenize", "column_def", "normalize_column_type", "ColumnDef", "CreateTable",
           "CreateTableLike", "AlterTable", "RenameTables", "DropTables", "Truncate", "Unparsed", "AddColumn",
           "DropColumn", "ChangeColumn", "RenameColumn", "SetPrimaryKey"]
