"""Renames across a table's shapes: what a sink takes from the ``renamed_from`` of its schema records.

A column's ``renamed_from`` names it in the shape just before, and only there. A sink that jumps
over shapes (stopped over several DDL statements, two renames between two of its batches, the
rows of a middle shape all in another partition) would take a rename of a shape it skipped for a
dropped column and a new one, whose older rows then read NULL. So the renames of every shape
between the one a table follows and the one it takes on are chained (``earlier_names``), and a
table column is renamed when a column of the new shape once had its name (``renames_to_follow``).
Only the renames are chained: a shape in between may list columns of a later one (a MySQL source
resuming past DDL publishes the catalog's columns at the first statement), which a table must
not take. Used by the sql and Delta sinks, through ``cdc.api``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any


def earlier_names(shapes: Sequence[dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Each column of the last of ``shapes`` (schema records, oldest first) -> the names it had in
    the ones before, newest first, by their ``renamed_from``; () for a column never renamed."""
    names: dict[str, tuple[str, ...]] = {}
    for shape in shapes:
        names = {c["name"]: (c["renamed_from"], *names.get(c["renamed_from"], ())) if c.get("renamed_from")
                 else names.get(c["name"], ()) for c in shape.get("columns") or ()}
    return names


def renames_to_follow(earlier: Mapping[str, Sequence[str]], table: Collection[str],
                      fold: Callable[[str], str] = str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """New name -> (the ``table`` column to rename to it, the names it had in between, newest
    first) for the columns of a shape (``earlier``: its ``earlier_names``) that ``table`` (its
    column names) lacks and has under an earlier name, the newest it has, that the shape no
    longer uses. The names in between are those that rows of the skipped shapes, read later,
    carry the column's values under. ``fold``: how names compare (``str.lower`` for a target
    whose names ignore case)."""
    have = {fold(name): name for name in table}
    current = {fold(name) for name in earlier}
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for new, before in earlier.items():
        if fold(new) in have:
            continue
        found = next((i for i, name in enumerate(before) if fold(name) in have), None)
        if found is not None and fold(before[found]) not in current:
            out[new] = (have.pop(fold(before[found])), tuple(before[:found]))
    return out
