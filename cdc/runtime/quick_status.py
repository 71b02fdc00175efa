"""``cdc status FILE [NAME...] [--json]`` answered by the running daemon, importing nothing heavy.

The slow path (``cdc.runtime.cli.cmd_status``) loads the whole config: pydantic, every plugin's
model, SQLAlchemy through the SQL sink's; then it asks the log and the PostgreSQL servers. When
the daemon that runs FILE is up, all of that is already loaded there: this reads from FILE only
the daemon's ``http`` address and the connector names (through the config loader's YAML reader,
with the same ``${VAR}`` interpolation), asks ``GET /status/report`` over the loopback, and prints
the rows with the same functions the slow path prints with (``status_lines``).

It answers only when everything matches: the arguments are the plain form, the parts of the file
it reads have no problem, the daemon answers with 200 for this very file (same real path, same
SHA-256: not edited since the daemon loaded it). Otherwise it returns None and the slow path
runs, which also reports whatever is wrong. Nothing here imports pydantic or SQLAlchemy
(``tests/integration/test_quick_status.py`` checks).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from urllib.parse import quote

# Seconds to wait for the answer; then the slow path asks. The daemon asks each PostgreSQL server
# for its slots with a 5 s connect timeout (slots_cli.CONNECT_TIMEOUT), so a slow server is waited
# for here rather than asked twice.
TIMEOUT = 8.0


def quick_status(argv: list[str]) -> int | None:
    """The exit code when the daemon answered for ``argv`` (what follows ``status``); None to
    take the slow path."""
    parsed = _arguments(argv)
    if parsed is None:
        return None
    file, names, as_json = parsed
    try:
        with open(file, "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    found = _read_config(text, file, names)
    if found is None:
        return None
    address, shown = found
    report = _ask(address, shown)
    if report is None or report.get("file") != os.path.realpath(file) \
            or report.get("digest") != hashlib.sha256(data).hexdigest():
        return None
    from cdc.runtime.status_lines import slot_line, status_line, store_lines

    for problem in report["problems"]:
        print(f"cdc status: {problem}", file=sys.stderr)
    if as_json:
        print(json.dumps(report["rows"] + report["slots"], indent=2))
        return report.get("exit", 0)
    for row in report["rows"]:
        print(status_line(row))
        for line in store_lines(row):
            print(line)
    for row in report["slots"]:
        print(slot_line(row))
    return report.get("exit", 0)


def _arguments(argv: list[str]) -> tuple[str, list[str], bool] | None:
    """(file, names, --json) for the plain form; None for anything else (--help, options the
    slow path's parser knows, abbreviations)."""
    positional = [a for a in argv if not a.startswith("-")]
    options = [a for a in argv if a.startswith("-")]
    if not positional or any(o != "--json" for o in options):
        return None
    return positional[0], positional[1:], bool(options)


def _read_config(text: str, file: str, names: list[str]) -> tuple[tuple[str, int], list[str]] | None:
    """(the daemon's host and port, the connectors to show), or None when the file says no daemon,
    names a connector it does not declare, or has a problem in a part that matters here."""
    from cdc.config.address import DEFAULT_HTTP, parse_http_address
    from cdc.config.loader import read_yaml

    doc = read_yaml(text, file, os.environ)
    if not isinstance(doc.data, dict):
        return None
    declared: dict[tuple[str | int, ...], str] = {}  # (section, index): a problem's path begins so
    for section in ("sources", "sinks"):
        items = doc.data.get(section) or []
        if not isinstance(items, list):
            return None
        for index, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            declared[(section, index)] = item["name"]
    if any(n not in declared.values() for n in names):
        return None  # the slow path says which
    shown = names or list(declared.values())
    if not shown:
        return None  # nothing declared: nothing a daemon could add
    # A problem (an unset variable, say) matters unless it lies in a connector not shown: the
    # slow path loads only the connectors shown, too.
    for path, _line, _message in doc.problems:
        connector = declared.get(tuple(path[:2]))
        if connector is None or connector in shown:
            return None
    http = doc.data.get("http", DEFAULT_HTTP)
    if not isinstance(http, str):
        return None
    try:
        return parse_http_address(http), shown
    except ValueError:
        return None


def _ask(address: tuple[str, int], names: list[str]) -> dict | None:
    """GET /status/report from the daemon, as HTTP/1.0 over a plain socket: the daemon's server
    (``http.server``) answers 1.0 and closes, and ``http.client`` would import the ``email``
    package, a third of this path's imports."""
    query = "&".join("name=" + quote(n, safe="") for n in names)
    request = f"GET /status/report?{query} HTTP/1.0\r\nHost: {address[0]}\r\n\r\n".encode()
    host, port = address
    try:
        # An address as bytes skips the IDNA codec (and unicodedata) that a str host pulls in.
        with socket.create_connection((host.encode("ascii"), port),  # type: ignore[arg-type]  # bytes: see above
                                      timeout=TIMEOUT) as conn:
            conn.sendall(request)
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
    except (OSError, UnicodeEncodeError):
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
