"""The server side of capture: connections, prerequisites, captured tables, binlog positions.

Every failed prerequisite raises ``PrerequisiteError`` with the fix (all settings problems at
once), and a stored position the server no longer has raises ``PositionLostError`` naming the
recovery, so a first run tells the operator exactly what to change.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

import pymysql

from cdc.api import servers
from cdc.errors import PositionLostError, PrerequisiteError
from cdc.events import TableId
from cdc.positions import MySqlPosition
from sources.mysql.columns import ColumnSpec
from sources.mysql.config import MySqlConfig
from sources.mysql.ddl import ColumnDef, normalize_column_type
from sources.mysql.errors import wrap
from sources.mysql.gtid import GtidPosition
from sources.mysql.schema import TableSchema
from sources.mysql.types import BINARY_TYPES, ColumnType

SYSTEM_DATABASES = ("mysql", "information_schema", "performance_schema", "sys")

# variable -> (required value, how to set it)
REQUIRED_SETTINGS = {
    "log_bin": ("ON", "enable the binary log: start the server with --log-bin=<basename>"),
    "binlog_format": ("ROW", "SET GLOBAL binlog_format = 'ROW' (and binlog_format=ROW in the server's config)"),
    "binlog_row_image": ("FULL", "SET GLOBAL binlog_row_image = 'FULL' (and in the config): updates and "
                                 "deletes must carry whole rows"),
    "binlog_row_metadata": ("FULL", "SET GLOBAL binlog_row_metadata = 'FULL' (and in the config): without it "
                                    "the binlog has no column names, primary keys or ENUM/SET labels"),
}


def connect(config: MySqlConfig, *, raw: bool = False, **extra) -> pymysql.connections.Connection:
    """A pymysql connection in autocommit. ``raw``: no type conversion (bytes for numbers and
    binary strings, str for text): the snapshot converts values itself (``types.text_converter``)."""
    settings = config.connection_settings()
    kwargs = {**settings, "autocommit": True, **extra}
    if raw:
        kwargs["conv"] = {}
    try:
        return pymysql.connect(**kwargs)
    except pymysql.Error as err:
        raise wrap(err, f"source {config.name}: connecting to {settings['host']}:{settings['port']} as "
                        f"{settings['user']}", setting=servers.setting_of("source", config.name, "url"),
                   role=settings["user"]) from err


def query(conn, sql: str, args: tuple | None = None, what: str | None = None) -> list[tuple]:
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    except pymysql.Error as err:
        raise wrap(err, what or sql.split()[0]) from err


def server_variables(conn) -> dict[str, str]:
    names = (*REQUIRED_SETTINGS, "log_bin_compress", "version", "gtid_strict_mode", "server_id")
    rows = query(conn, "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ",".join(["%s"] * len(names)) + ")",
                 names, "reading the server's settings")
    return {name: str(value) for name, value in rows}


def is_mariadb(variables: dict[str, str]) -> bool:
    return "mariadb" in variables.get("version", "").lower()


def check_settings(variables: dict[str, str]) -> None:
    """Every setting capture needs, with its fix; all problems in one error."""
    problems = []
    for name, (required, fix) in REQUIRED_SETTINGS.items():
        value = variables.get(name)
        if value is None:
            if name == "binlog_row_metadata":
                problems.append("the server has no binlog_row_metadata (MariaDB 10.5+ or MySQL 8.0.1+ is needed "
                                "for column names in the binlog)")
            else:
                problems.append(f"{name} is not set: {fix}")
        elif value.upper() != required:
            problems.append(f"{name} is {value}, capture needs {required}: {fix}")
    if variables.get("log_bin_compress", "OFF").upper() == "ON":
        problems.append("log_bin_compress is ON: compressed row events are not decoded; SET GLOBAL "
                        "log_bin_compress = OFF")
    if problems:
        raise PrerequisiteError("the server is not set up for binlog capture: " + "; ".join(problems))


def check_privileges(conn) -> None:
    """REPLICATION SLAVE (to read the binlog) and REPLICATION CLIENT / BINLOG MONITOR (to see the
    binlog files and positions), held directly or through an enabled role."""
    user = query(conn, "SELECT CURRENT_USER()")[0][0]
    name, _, host = user.rpartition("@")
    grantees = [f"'{name}'@'{host}'"] + [f"'{r[0]}'" for r in query(
        conn, "SELECT ROLE_NAME FROM information_schema.ENABLED_ROLES")]
    held = {row[0].upper() for row in query(
        conn, "SELECT PRIVILEGE_TYPE FROM information_schema.USER_PRIVILEGES WHERE GRANTEE IN ("
              + ",".join(["%s"] * len(grantees)) + ")", tuple(grantees), "reading the user's privileges")}
    if "SUPER" in held:
        held |= {"REPLICATION CLIENT"}
    missing = []
    if "REPLICATION SLAVE" not in held:
        missing.append("REPLICATION SLAVE")
    if not held & {"REPLICATION CLIENT", "BINLOG MONITOR"}:
        missing.append("REPLICATION CLIENT")
    if missing:
        raise PrerequisiteError(f"user {user} lacks {' and '.join(missing)}: GRANT {', '.join(missing)} ON *.* "
                                f"TO '{name}'@'{host}' (binlog capture reads the binary log as a replica does)")


# --- binlog positions -------------------------------------------------------------------------------

def binary_logs(conn) -> list[str]:
    return [row[0] for row in query(conn, "SHOW BINARY LOGS", what="listing the binary logs")]


def current_position(conn) -> tuple[str, int]:
    rows = query(conn, "SHOW MASTER STATUS", what="reading the binlog position")
    if not rows:
        raise PrerequisiteError("SHOW MASTER STATUS is empty: the binary log is off (start the server with --log-bin)")
    return rows[0][0], int(rows[0][1])


def gtid_at(conn, file: str, pos: int) -> str | None:
    """MariaDB's GTID position at a binlog coordinate (BINLOG_GTID_POS); None where unknown."""
    rows = query(conn, "SELECT BINLOG_GTID_POS(%s, %s)", (file, pos), "reading the GTID position")
    value = rows[0][0] if rows else None
    if isinstance(value, bytes):
        value = value.decode()
    return value if value is not None else None


def check_position(conn, position: MySqlPosition, by_gtid: bool, source: str) -> None:
    """Raise PositionLostError when the changes after ``position`` are no longer on the server."""
    files = binary_logs(conn)
    if not files:
        raise PrerequisiteError("the server lists no binary logs")
    if position.file in files:
        return
    if by_gtid and position.gtid_set is not None:
        # The stored file is gone; nothing is lost if every transaction of the purged files is
        # already in our GTID position (the oldest file starts at or before it).
        oldest = gtid_at(conn, files[0], 4)
        if oldest is not None and GtidPosition.parse(oldest).covered_by(GtidPosition.parse(position.gtid_set)):
            return
    raise PositionLostError(
        f"source {source}: the binlog {position.file} holding the stored position {position} has been purged "
        f"(the oldest binlog is {files[0]}): the changes after it cannot be read. Recovery: take a new snapshot "
        f"(set snapshot: when_needed, or reset the source's offset with a tombstone for "
        f"{{\"source\": \"{source}\"}} in the offsets topic); keep binlogs longer (binlog_expire_logs_seconds)")


# --- tables -----------------------------------------------------------------------------------------

def matches(db: str, table: str, globs: Iterable[str]) -> bool:
    if db in SYSTEM_DATABASES:
        return False
    name = f"{db}.{table}"
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def captured_tables(conn, globs: list[str]) -> list[tuple[str, str]]:
    rows = query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                       "WHERE TABLE_TYPE IN ('BASE TABLE', 'SYSTEM VERSIONED') ORDER BY 1, 2",
                 what="listing tables")
    return [(db, table) for db, table in rows if matches(db, table, globs)]


_JSON_CHECK = re.compile(r"^\s*json_valid\(`((?:[^`]|``)+)`\)\s*$", re.I)


def load_schemas(conn, names: list[tuple[str, str]], key_columns: dict[str, list[str]]) -> dict[tuple[str, str], TableSchema]:
    """Columns, keys and JSON columns of ``names`` from information_schema, as of now."""
    if not names:
        return {}
    wanted = set(names)
    dbs = sorted({db for db, _ in names})
    marks = ",".join(["%s"] * len(dbs))
    columns: dict[tuple[str, str], list[tuple]] = {}
    for row in query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, "
                           "DATETIME_PRECISION, CHARACTER_SET_NAME, CHARACTER_OCTET_LENGTH FROM "
                           f"information_schema.COLUMNS WHERE TABLE_SCHEMA IN ({marks}) "
                           "ORDER BY TABLE_SCHEMA, TABLE_NAME, ORDINAL_POSITION", tuple(dbs), "reading columns"):
        if (row[0], row[1]) in wanted:
            columns.setdefault((row[0], row[1]), []).append(row[2:])
    keys: dict[tuple[str, str], list[str]] = {}
    for db, table, column in query(conn, "SELECT TABLE_SCHEMA, TABLE_NAME, COLUMN_NAME FROM information_schema."
                                         f"STATISTICS WHERE TABLE_SCHEMA IN ({marks}) AND INDEX_NAME = 'PRIMARY' "
                                         "ORDER BY TABLE_SCHEMA, TABLE_NAME, SEQ_IN_INDEX", tuple(dbs),
                                   "reading primary keys"):
        keys.setdefault((db, table), []).append(column)
    json_columns: dict[tuple[str, str], set[str]] = {}
    try:
        checks = query(conn, "SELECT CONSTRAINT_SCHEMA, TABLE_NAME, CHECK_CLAUSE FROM information_schema."
                             f"CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA IN ({marks})", tuple(dbs))
    except Exception:  # noqa: BLE001 - MySQL < 8.0.16 has no CHECK_CONSTRAINTS (and no MariaDB JSON)
        checks = []
    for db, table, clause in checks:
        match = _JSON_CHECK.match(clause or "")
        if match:
            json_columns.setdefault((db, table), set()).add(match.group(1).replace("``", "`"))
    out = {}
    for db, table in names:
        if (db, table) not in columns:
            continue  # dropped meanwhile
        key = tuple(keys.get((db, table), ()))
        defs = []
        for name, data_type, column_type, nullable, fsp, charset, octets in columns[(db, table)]:
            data_type = data_type.lower()
            is_json = data_type == "json" or name in json_columns.get((db, table), ())
            binary = data_type in BINARY_TYPES or (charset or "").lower() == "binary"
            type_ = ColumnType(data_type, normalize_column_type(column_type), int(fsp or 0), is_json, binary,
                               int(octets or 0) if data_type == "binary" else 0)
            defs.append(ColumnDef(name, type_, nullable == "YES", name in key))
        out[(db, table)] = TableSchema(TableId(db, None, table), defs, key or resolve_key(db, table, defs, key_columns))
    return out


def resolve_key(db: str, table: str, columns: Iterable[ColumnDef | ColumnSpec],
                key_columns: dict[str, list[str]]) -> tuple[str, ...]:
    """The event key of a table without a primary key: the configured columns, or an error with the fix."""
    qualified = f"{db}.{table}"
    configured = key_columns.get(qualified)
    if not configured:
        raise PrerequisiteError(f"table {qualified} has no primary key: add one, or give its event key in the "
                                f"source's key_columns ({{'{qualified}': [col, ...]}})")
    unknown = set(configured) - {c.name for c in columns}
    if unknown:
        raise PrerequisiteError(f"key_columns of {qualified} names unknown columns {sorted(unknown)}")
    return tuple(configured)


def json_columns(conn, db: str, table: str) -> set[str]:
    """The MariaDB JSON columns (LONGTEXT with a json_valid check) of one table, as of now."""
    try:
        rows = query(conn, "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE "
                           "CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s", (db, table))
    except Exception:  # noqa: BLE001 - no CHECK_CONSTRAINTS (old MySQL): no MariaDB JSON either
        rows = []
    found = {m.group(1).replace("``", "`") for (clause,) in rows if (m := _JSON_CHECK.match(clause or ""))}
    found |= {name for (name,) in query(conn, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE "
                                              "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND DATA_TYPE = 'json'",
                                        (db, table))}
    return found
