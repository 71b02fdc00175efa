"""The session settings that make PostgreSQL's text output predictable.

Column values reach the source as the type output function's text: pgoutput sends it on the
replication connection, ``COPY ... TO STDOUT`` prints it on the snapshot connection. Several output
functions depend on session settings (time zone, date and interval style, float digits, bytea
format, money locale). Both connections run with the same fixed settings, so one converter per
column turns either text into the same JSON value, and the converters can rely on the exact shape
(``+00`` offsets, ISO dates, hex bytea) instead of parsing every variant.
"""

from __future__ import annotations

SESSION_SETTINGS: dict[str, str] = {
    "TimeZone": "UTC",               # timestamptz prints as '... +00', sliced into '...Z'
    "DateStyle": "ISO, MDY",         # 'YYYY-MM-DD HH:MM:SS' for date/time types
    "IntervalStyle": "iso_8601",     # 'P1Y2M3DT4H5M6S'
    "extra_float_digits": "3",       # shortest text that reads back to the same float (PG 12+)
    "bytea_output": "hex",           # '\x00ff'
    "lc_monetary": "C",              # money prints as '$1,234.50' whatever the server locale
}


def _escape_option_value(value: str) -> str:
    # libpq splits ``options`` on spaces unless escaped with a backslash; '\\' is a backslash.
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def session_options(existing: str | None = None) -> str:
    """``SESSION_SETTINGS`` as a libpq ``options`` string: ``-c TimeZone=UTC -c DateStyle=ISO,\\ MDY ...``.

    ``existing`` (a user's own ``options``) is kept in front; ours come last so they win, because
    the converters depend on them. Pass the result as ``psycopg2.connect(dsn, options=...)`` on
    both the snapshot and the replication connection.
    """
    ours = " ".join(f"-c {name}={_escape_option_value(value)}" for name, value in SESSION_SETTINGS.items())
    return f"{existing} {ours}" if existing else ours
