"""opensearch-py errors -> the framework's error tree, by HTTP status and error type (never text).

* no connection, a timeout, 429 (``es_rejected_execution_exception``: a full write queue),
  5xx: ``RetriableError``; the runtime retries the same batch later (that is the backpressure).
* 401/403 (credentials), 404 (an index that should exist) and every other 4xx: ``PermanentError``.
"""

from __future__ import annotations

from cdc.api import CdcError, PermanentError, RetriableError

RETRIABLE_ITEM_TYPES = frozenset({"es_rejected_execution_exception", "unavailable_shards_exception",
                                  "cluster_block_exception", "node_closed_exception",
                                  "process_cluster_event_timeout_exception"})


def item_retriable(status: int, error_type: str | None) -> bool:
    """Whether a bulk item that failed may succeed when sent again."""
    return status == 429 or status >= 500 or error_type in RETRIABLE_ITEM_TYPES


def translate(err: BaseException, what: str) -> CdcError:
    from opensearchpy import exceptions as ex

    if isinstance(err, CdcError):
        return err
    if isinstance(err, (ex.ConnectionError, ex.ConnectionTimeout)):
        return RetriableError(f"{what}: OpenSearch cannot be reached: {err}")
    if isinstance(err, ex.TransportError):
        status = err.status_code if isinstance(err.status_code, int) else 0
        error_type = err.error if isinstance(err.error, str) else None
        if status == 0 or item_retriable(status, error_type):
            return RetriableError(f"{what}: OpenSearch answered {status} {error_type}: {_reason(err)}")
        if status in (401, 403):
            return PermanentError(f"{what}: OpenSearch refused the credentials ({status}): check username/"
                                  f"password or api_key, and the user's permissions: {_reason(err)}")
        return PermanentError(f"{what}: OpenSearch answered {status} {error_type}: {_reason(err)}")
    return PermanentError(f"{what}: {type(err).__name__}: {err}")


def _reason(err) -> str:
    info = err.info if isinstance(err.info, dict) else {}
    error = info.get("error")
    if isinstance(error, dict):
        return str(error.get("reason") or error.get("type"))
    return str(err.info or err)
