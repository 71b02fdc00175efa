"""opensearch-py errors -> the framework's error tree, by HTTP status and error type (never text).

* no connection, a timeout, 429 (``es_rejected_execution_exception``: a full write queue),
  5xx: ``RetriableError``; the runtime retries the same batch later (that is the backpressure).
* a node certificate that the CA in ``ca_file`` (or the system's) does not verify, 401 (the
  username/password or client certificate) and 403 (the user may not do this): ``ConfigError``, naming the
  node URLs (without any credentials in them) and the setting to correct. Retrying cannot help.
* 404 (an index that should exist) and every other 4xx: ``PermanentError``.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

from cdc.api import CdcError, ConfigError, PermanentError, RetriableError

RETRIABLE_ITEM_TYPES = frozenset({"es_rejected_execution_exception", "unavailable_shards_exception",
                                  "cluster_block_exception", "node_closed_exception",
                                  "process_cluster_event_timeout_exception"})


def item_retriable(status: int, error_type: str | None) -> bool:
    """Whether a bulk item that failed may succeed when sent again."""
    return status == 429 or status >= 500 or error_type in RETRIABLE_ITEM_TYPES


def shown(hosts) -> str:
    """The node URLs for a message: any ``user:password@`` taken out."""
    out = []
    for host in hosts:
        parts = urlsplit(host)
        netloc = parts.netloc.rpartition("@")[2]
        out.append(urlunsplit(parts._replace(netloc=netloc)))
    return ", ".join(out)


def translate(err: BaseException, what: str, hosts=()) -> CdcError:
    from opensearchpy import exceptions as ex

    if isinstance(err, CdcError):
        return err
    where = shown(hosts) or "OpenSearch"
    if isinstance(err, ex.SSLError) and _certificate_refused(err):
        return ConfigError(f"{what}: the TLS certificate of {where} is not trusted ({_cause(err)}): set ca_file "
                           f"to the CA that signed the node's certificate")
    if isinstance(err, (ex.ConnectionError, ex.ConnectionTimeout)):
        return RetriableError(f"{what}: OpenSearch cannot be reached at {where}: {err}")
    if isinstance(err, ex.TransportError):
        status = err.status_code if isinstance(err.status_code, int) else 0
        error_type = err.error if isinstance(err.error, str) else None
        if status == 0 or item_retriable(status, error_type):
            return RetriableError(f"{what}: OpenSearch answered {status} {error_type}: {_reason(err)}")
        if status == 401:
            return ConfigError(f"{what}: {where} refused the credentials (401): correct username and password "
                               f"(or password_file), or the client certificate (client_cert_file) and the "
                               f"node's mapping of it to a user")
        if status == 403:
            return ConfigError(f"{what}: {where} refused the request for lack of permissions (403): give the "
                               f"user the permission, or use one that has it: {_reason(err)}")
        return PermanentError(f"{what}: OpenSearch answered {status} {error_type}: {_reason(err)}")
    return PermanentError(f"{what}: {type(err).__name__}: {err}")


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, its ``info`` and their causes and contexts (opensearch-py wraps urllib3's error,
    which wraps the ssl module's)."""
    seen: set[int] = set()
    todo: list[object] = [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen or not isinstance(current, BaseException):
            continue
        seen.add(id(current))
        yield current
        todo.extend([getattr(current, "info", None), current.__cause__, current.__context__,
                     *(a for a in getattr(current, "args", ()) if isinstance(a, BaseException))])


def _certificate_refused(err: BaseException) -> bool:
    """A certificate that did not verify (by the ssl module's error type, not its text): the
    same on every attempt. Other TLS failures (a handshake cut short) may pass on a retry."""
    return any(isinstance(e, ssl.SSLCertVerificationError) for e in _chain(err))


def _cause(err: BaseException) -> str:
    for e in _chain(err):
        if isinstance(e, ssl.SSLCertVerificationError):
            return e.verify_message or str(e)
    return str(err)


def _reason(err) -> str:
    info = err.info if isinstance(err.info, dict) else {}
    error = info.get("error")
    if isinstance(error, dict):
        return str(error.get("reason") or error.get("type"))
    return str(err.info or err)


@contextmanager
def translating(what: str, hosts=()) -> Iterator[None]:
    """opensearch-py's errors raised inside, as ``translate`` types them (``what``: the sink and
    the step, for the message); the project's own errors and any other pass through."""
    try:
        yield
    except CdcError:
        raise
    except Exception as err:  # noqa: BLE001 - opensearch-py's errors, classified by status and type
        if type(err).__module__.startswith("opensearchpy"):
            raise translate(err, what, hosts) from err
        raise
