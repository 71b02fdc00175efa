"""The runtime's context for a plugin a test runs outside the daemon."""

from __future__ import annotations

from cdc.runtime.contexts import sink_context


def attached(sink, log_config=None):
    """``sink`` with the runtime's context, as the worker attaches it to a self-driven sink: its
    services (a Kafka log, the schema topic, the registry, the Spark jars) are the real ones."""
    sink.attach(sink_context(sink.config.name, log_config=log_config))
    return sink
