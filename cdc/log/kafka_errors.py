"""Kafka client errors as the framework's typed errors, shared by every Kafka handle of the log
(``kafka``: the client, ``kafka_bulk``: a bulk load's reader, ``block_producer``: a snapshot's
blocks): which codes are transient, and the message that names what failed and where."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from cdc.errors import CdcError, DeliveryError, LogUnavailableError, PermanentError
from cdc.log.kafka_logs import UNREACHABLE

# Errors that may clear up by themselves: the broker is away, slow, or electing a leader, or the
# record was purged locally. librdkafka already retried these until ``message.timeout.ms``; what
# reaches a delivery report otherwise (too large, invalid, unauthorized, unknown topic, a fatal
# idempotence error) is an error it judged permanent, and so do we.
TRANSIENT = frozenset({
    KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE,
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
    KafkaError._QUEUE_FULL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._DESTROY,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION, KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.KAFKA_STORAGE_ERROR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.THROTTLING_QUOTA_EXCEEDED,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REBALANCE_IN_PROGRESS,
    # A replicated cluster losing a node (tests/faults/test_kafka_cluster.py): a request on its
    # way to that node fails with its broker handle destroyed, and for a moment the metadata
    # lists a partition without it (no leader elected yet) or names a node that moved.
    KafkaError._DESTROY_BROKER, KafkaError._UNKNOWN_PARTITION, KafkaError._NODE_UPDATE, KafkaError._WAIT_COORD,
    KafkaError.NOT_CONTROLLER,
})


def kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return arg if isinstance(arg, KafkaError) else None


# What a client says when it cannot talk to any broker (the connection, not the request, failed).
UNREACHABLE_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                               KafkaError._RESOLVE, KafkaError._WAIT_COORD})


def wrap(what: str, exc: BaseException, servers: str | None = None) -> CdcError:
    """A client-side failure as a typed error: transient codes and timeouts -> LogUnavailableError.
    With ``servers`` (the bootstrap list), a failure to reach any broker says so first, naming the
    setting and the address librdkafka last tried (cdc.log.kafka_logs folds its own lines into it)."""
    err = kafka_error(exc)
    if err is None or err.code() in TRANSIENT:
        detail = f"{err.name()}: {err.str()}" if err is not None else f"{type(exc).__name__} {exc}"
        tried = UNREACHABLE.describe()
        if servers is not None and (err is None or err.code() in UNREACHABLE_CODES) and tried is not None:
            return LogUnavailableError(f"no Kafka broker at {servers} (log.kafka.bootstrap_servers) can be "
                                       f"reached ({tried}); {what} failed: {detail}")
        return LogUnavailableError(f"{what}: {detail}")
    return PermanentError(f"{what}: {err.name()}: {err.str()}")


def delivery_error(err: KafkaError, topic: str, partition: int | None) -> DeliveryError:
    where = topic if partition is None or partition < 0 else f"{topic}[{partition}]"  # None: unassigned
    return DeliveryError(f"delivery to {where} failed: {err.name()}: {err.str()}",
                         retriable=err.code() in TRANSIENT)
