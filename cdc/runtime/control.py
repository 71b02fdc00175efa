"""Commands to a running daemon over its HTTP API: restart, pause, resume or rebuild one connector,
or take an incremental snapshot of a source's tables (a JSON body ``{"tables": [...]}``).

``POST /connectors/<name>/<action>`` changes state, so it is guarded: with ``http_token`` (or
``http_token_file``) set in the config file, a request must carry ``Authorization: Bearer
<token>``; without one, the daemon takes commands only while it listens on a loopback address
(anyone who can reach another interface could otherwise stop its connectors). GET requests
(``/status``, ``/metrics``, ``/healthz``) stay open: they change nothing.

The CLI side (``post_command``, ``daemon_status``) reads the same config file, so it knows the
address and the token.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import urllib.error
import urllib.request

from cdc.errors import ConfigError, RetriableError

COMMAND_TIMEOUT = 15.0  # seconds the CLI waits for the daemon to take a command


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authorize(host: str, token: str | None, header: str | None) -> tuple[int, str] | None:
    """None when a state-changing request may go ahead; else (HTTP status, why not)."""
    if token:
        given = (header or "").removeprefix("Bearer ").strip()
        if hmac.compare_digest(given.encode(), token.encode()):
            return None
        return 401, "this daemon takes commands only with its token (Authorization: Bearer <http_token>)\n"
    if is_loopback(host):
        return None
    return 403, (f"the daemon listens on {host}, not loopback, and has no http_token: it takes no commands; "
                 "set http_token (or http_token_file) in the config file\n")


def parse_command_path(path: str) -> tuple[str, str] | None:
    """``/connectors/<name>/<action>`` -> (name, action)."""
    parts = path.strip("/").split("/")
    if len(parts) == 3 and parts[0] == "connectors":
        return parts[1], parts[2]
    return None


def post_command(config, name: str, action: str, body: dict | None = None) -> dict:
    """Send ``action`` for connector ``name`` to the daemon of ``config``; its answer as a dict
    (``message``). ConfigError when it refuses; RetriableError when no daemon answers."""
    if not config.http:
        raise ConfigError("the config file has `http: null`: the daemon serves no API to send commands to")
    request = urllib.request.Request(f"http://{config.http}/connectors/{name}/{action}",
                                     data=json.dumps(body).encode() if body else b"", method="POST")
    token = config.token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=COMMAND_TIMEOUT) as response:
            return json.load(response)
    except urllib.error.HTTPError as err:
        message = err.read().decode(errors="replace")
        try:
            message = json.loads(message).get("message", message)
        except ValueError:
            pass
        raise ConfigError(f"the daemon at {config.http} refused to {action} {name}: {message.strip()}") from None
    except OSError as err:
        raise RetriableError(f"no daemon answers at {config.http} ({err}); is `cdc run` running with this "
                             "file?") from None


def daemon_status(http: str | None) -> list[dict] | None:
    """The daemon's ``/status`` rows, or None when no daemon answers at ``http``."""
    if not http:
        return None
    try:
        with urllib.request.urlopen(f"http://{http}/status", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def refuse_if_daemon_runs(config, name: str, kind: str = "sink") -> None:
    """``ConfigError`` when the daemon of ``config`` runs connector ``name``: a command that works
    on it from outside (``cdc bootstrap``, ``cdc drop``) must not run beside it."""
    live = {row["name"]: row for row in (daemon_status(config.http) or [])}
    if name in live and live[name].get("phase") not in (None, "stopped", "failed", "finished"):
        raise ConfigError(f"the daemon at {config.http} runs {kind} {name}: stop it there first "
                          f"(cdc run FILE --only <the others>), then run this again")
