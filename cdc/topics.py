"""The framework's own topics, and the one rule that tells them from the tables' topics.

Every topic of a log under a prefix is one of:

* a table's topic, ``<prefix>.<schema>.<table>`` (MySQL: ``<prefix>.<db>.<table>``): what sinks read;
* ``<prefix>.offsets``: the sources' stored positions (cdc/offsets.py);
* ``<prefix>.schema-changes``: every shape of every table (cdc/serde.py);
* ``<prefix>.dead-letter.<sink>``: the records a sink set aside (cdc/runtime/dead_letters.py);
* ``<prefix>.member-shares.<sink>``: never written; its partitions are the shares a ``SharedSink``'s
  group members divide among themselves (cdc/runtime/sink_shares.py).

``internal_topic`` says which are the framework's own; a sink's globs never select one of them
(``table_topics``), and a regular expression subscription (Spark) puts
``INTERNAL_TOPICS_LOOKAHEAD`` before its alternatives for the same rule. A leaf module: it
imports nothing of the framework, so plugins get it through ``cdc.api``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

OFFSETS_SUFFIX = ".offsets"
SCHEMA_CHANGES_SUFFIX = ".schema-changes"
DEAD_LETTER_INFIX = ".dead-letter."
SHARES_INFIX = ".member-shares."


def offsets_topic(prefix: str) -> str:
    return f"{prefix}{OFFSETS_SUFFIX}"


def schema_changes_topic(prefix: str) -> str:
    return f"{prefix}{SCHEMA_CHANGES_SUFFIX}"


def dead_letter_topic(prefix: str, sink_name: str) -> str:
    """The default dead-letter topic of a sink (its ``dead_letter_topic`` setting overrides it)."""
    return f"{prefix}{DEAD_LETTER_INFIX}{sink_name}"


def shares_topic(prefix: str, sink_name: str) -> str:
    """The topic whose partitions a shared sink's members divide (one per share)."""
    return f"{prefix}{SHARES_INFIX}{sink_name}"


def dead_letter_sink(prefix: str, topic: str) -> str | None:
    """The sink whose default dead-letter topic ``topic`` is, or None if it is none under ``prefix``."""
    head = f"{prefix}{DEAD_LETTER_INFIX}"
    return topic[len(head):] if topic.startswith(head) else None


def internal_topic(topic: str) -> bool:
    """A topic of the framework's own (offsets, schema changes, dead letters, shares), never a table's."""
    return topic.endswith((OFFSETS_SUFFIX, SCHEMA_CHANGES_SUFFIX)) or DEAD_LETTER_INFIX in topic \
        or SHARES_INFIX in topic


def table_topics(topics: Iterable[str], globs: Iterable[str]) -> list[str]:
    """The tables' topics among ``topics`` that match one of ``globs`` (fnmatch), sorted."""
    globs = list(globs)
    return sorted(t for t in topics if any(fnmatch.fnmatchcase(t, g) for g in globs) and not internal_topic(t))


def _literal(text: str) -> str:
    return text.replace(".", r"\.")


# ``internal_topic`` as a regex prefix (Java and Python syntax) for a subscription pattern: put it
# before the alternatives of table topics so that none of the framework's own topics matches.
INTERNAL_TOPICS_LOOKAHEAD = (f"(?!.*{_literal(OFFSETS_SUFFIX)}$)(?!.*{_literal(SCHEMA_CHANGES_SUFFIX)}$)"
                             f"(?!.*{_literal(DEAD_LETTER_INFIX)})(?!.*{_literal(SHARES_INFIX)})")
