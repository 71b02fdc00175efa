"""Connections (single server or cluster, TLS, password from a secret) and error classification.

Redis errors are classified by their code, the first word of the error reply (``OOM``, ``BUSY``,
``LOADING``, ``TRYAGAIN``, ``MOVED`` ...), never by the rest of the message:

* retriable: connection and timeout errors, and the codes in ``RETRIABLE_CODES`` (the server is
  out of memory under its maxmemory policy, busy with a script, loading its data, a cluster slot
  is migrating or a master failing over). The runtime retries the batch with backoff; since every
  write is version-guarded, a pipeline half applied before the error is safe to send again;
* ``NOSCRIPT``: the writer reloads the scripts and resends (a restarted or failed-over server);
* a server certificate the client refuses (not signed by ``tls_ca_file``'s CA, or not naming the
  URL's host) is a ``ConfigError``: retrying cannot help until a setting changes. Told apart by
  the exception's type (``ssl.SSLCertVerificationError``, which redis-py wraps), never by text;
* anything else (a wrong type under a key, an unknown command such as JSON.SET without RedisJSON)
  is permanent.

A server that refuses the *client's* certificate (``tls-auth-clients yes`` and none or a wrong one
given) closes the connection after the handshake; the client sees an EOF like any dropped
connection, so that stays retriable (the sink's health shows ``retrying`` with the error). So
does ``rediss://`` to a port without TLS: Redis waits for a command line and the handshake times
out like an unreachable server.
"""

from __future__ import annotations

import os
import ssl
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
from redis.cluster import RedisCluster

from cdc.api import ConfigError, PermanentError, RetriableError
from sinks.redis.config import RedisSinkConfig

RETRIABLE_CODES = frozenset({"OOM", "BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY",
                             "MOVED", "ASK", "NOREPLICAS", "UNBLOCKED"})
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


def redacted_url(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` query argument), for
    messages and logs."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user, has_password, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if has_password else netloc
    query = parts.query
    if query:
        query = urlencode([(k, "***" if k == "password" else v) for k, v in parse_qsl(query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def tls_refusal(err: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed under ``err`` (redis-py raises a ConnectionError from
    it), if one did; None otherwise."""
    seen = 0
    cause: BaseException | None = err
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None


def error_code(err: BaseException) -> str:
    text = str(err)
    return text.split(" ", 1)[0].upper() if text else ""


def is_retriable(err: BaseException) -> bool:
    exc = redis.exceptions
    if tls_refusal(err) is not None:
        return False
    if isinstance(err, (exc.AuthenticationError, exc.AuthorizationError, exc.NoPermissionError)):
        return False  # a wrong password or missing ACL stays wrong
    if isinstance(err, exc.OutOfMemoryError):
        return True
    if isinstance(err, (exc.BusyLoadingError, exc.ClusterDownError, exc.TryAgainError, exc.ReadOnlyError,
                        exc.MasterDownError, exc.ClusterError, exc.MovedError, exc.AskError,
                        exc.SlotNotCoveredError, exc.MaxConnectionsError)):
        return True
    if isinstance(err, CONNECTION_ERRORS):
        return True
    if isinstance(err, redis.ResponseError):
        return error_code(err) in RETRIABLE_CODES
    return False


def is_noscript(err: BaseException) -> bool:
    return isinstance(err, redis.exceptions.NoScriptError) or (
        isinstance(err, redis.ResponseError) and error_code(err) == "NOSCRIPT")


def translate(err: BaseException, where: str) -> RetriableError | PermanentError:
    refusal = tls_refusal(err)
    if refusal is not None:
        return ConfigError(f"{where}: the server's TLS certificate was refused ({refusal.verify_message}); "
                           f"check tls_ca_file (the CA that signs the server's certificate) and "
                           f"that the certificate names the URL's host")
    kind = RetriableError if is_retriable(err) else PermanentError
    return kind(f"{where}: {type(err).__name__}: {err}")


def connect(config: RedisSinkConfig) -> redis.Redis | RedisCluster:
    """A client for the configured server or cluster (not yet connected: the first call connects)."""
    url = config.url.get_secret_value()
    options: dict = {"socket_timeout": 30, "socket_connect_timeout": 10, "health_check_interval": 30,
                     "client_name": f"cdc-sink-{config.name}"}
    if config.password is not None:
        options["password"] = config.password.get_secret_value()
    if url.startswith("rediss://"):
        for setting in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            path = getattr(config, setting)
            if path and not os.access(path, os.R_OK):
                # Checked here: redis-py would report a missing file as a connection error, retried forever.
                raise ConfigError(f"redis sink {config.name}: {setting} {path} cannot be read")
        options["ssl_cert_reqs"] = "required" if config.tls_verify else "none"
        if config.tls_ca_file:
            options["ssl_ca_certs"] = config.tls_ca_file
        if config.tls_cert_file:
            options["ssl_certfile"] = config.tls_cert_file
        if config.tls_key_file:
            options["ssl_keyfile"] = config.tls_key_file
    if config.cluster:
        # Retries on MOVED/ASK and failover are redis-py's; ours wrap them (see the writer).
        return RedisCluster.from_url(url, **options)
    if config.database is not None:
        options["db"] = config.database
    return redis.Redis.from_url(url, **options)


def command_known(server: redis.Redis, name: str) -> bool:
    """Whether the server has command ``name`` (``COMMAND INFO`` answers nil for an unknown one;
    read raw: redis-py's reply callback for COMMAND cannot take a nil)."""
    pool = server.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command("COMMAND", "INFO", name)
        reply = conn.read_response()
    finally:
        pool.release(conn)
    return bool(reply) and reply[0] is not None
