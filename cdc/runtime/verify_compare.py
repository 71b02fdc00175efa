"""The pure half of ``cdc verify``: rows in one comparable form, what differs between the two
sides of a chunk, and the report.

``canonical`` makes a value comparable wherever it lives, once both sides are in the forms the
store gives back (``ReadableSink.stored_forms`` maps the source side): a number (int, Decimal,
float, bool as 1/0) becomes its shortest decimal text, marked as a number (``Num``); instants are
put in UTC, bytes in base64, JSON (a dict, or text holding an object or array) with its keys
sorted; other text stays as it is, so ``007`` and ``7`` differ. ``same`` compares two values: the
same text, or a number and a text that reads as that number (SQLite gives back ``9.9`` for the
``"9.90"`` a write bound). A NULL column and a column the store has no field for (a Redis hash)
are the same: both are left out of the row.

A chunk's side is a dict of its rows in this form by canonical key (``by_key``): two equal dicts
are equal chunks (equal values are ``same``), and only a chunk whose dicts differ is compared key
by key (``compare``), where ``same`` also lets a number equal its text.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

from cdc.api import StoredRow, key_order

Row = tuple[tuple[str, Any], ...]  # (column, canonical value) sorted by column, NULLs left out


class Num(str):
    """A number's shortest decimal text (``canonical``): equal, by ``same``, to a text that reads
    as the same number."""

    __slots__ = ()


def canonical(value: Any) -> Any:
    """``value`` in the form compared (see the module docstring); None stays None."""
    kind = type(value)
    if kind is str:  # the common kinds first, each without the general path's tests
        return value if value[:1] not in ("{", "[") else _text(value)
    if kind is int:
        return Num(str(value))  # an int's text is already its shortest decimal text
    if kind is Decimal:
        return Num(_decimal(value)) if value.is_finite() else str(value)
    if kind is datetime:
        if value.tzinfo is None:
            return value.isoformat(sep=" ", timespec="microseconds")
        return value.astimezone(UTC).isoformat(sep=" ", timespec="microseconds")[:-6]  # less "+00:00"
    if value is None:
        return None
    if isinstance(value, bool):  # as the stores that have no boolean keep it (SQLite: 1)
        return Num("1" if value else "0")
    if isinstance(value, float) and not math.isfinite(value):  # spelled as Decimal and PostgreSQL do
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, (int, Decimal, float)):
        number = _number(str(value) if not isinstance(value, float) else repr(value))
        return Num(number) if number is not None else str(value)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (dict, list)):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return _text(str(value))


def _text(text: str) -> str:
    """Text, with JSON in it (an object or an array) in one spelling."""
    if text[:1] in ("{", "["):
        try:
            return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONDecodeError:
            return text
    return text


def _number(text: str) -> str | None:
    """The shortest decimal text of a finite number; None for anything else."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    if not number.is_finite():
        return None
    return _decimal(number)


def _decimal(number: Decimal) -> str:
    """The shortest decimal text of a finite Decimal."""
    return format(number.normalize(), "f") if number else "0"


def same(a: Any, b: Any) -> bool:
    """Whether two canonical values are equal (see the module docstring)."""
    if a == b:
        return True
    if isinstance(a, Num) and isinstance(b, str) and not isinstance(b, Num):
        return _number(b) == a
    if isinstance(b, Num) and isinstance(a, str):
        return _number(a) == b
    return False


def same_row(a: Row | None, b: Row | None) -> bool:
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x[0] == y[0] and same(x[1], y[1]) for x, y in zip(a, b))


def canonical_row(row: dict[str, Any]) -> Row:
    pairs = [(name, canonical(v)) for name, v in row.items() if v is not None]
    pairs.sort()  # by name alone: names are unique
    return tuple(pairs)


def canonical_key(key: Iterable[Any]) -> tuple:
    return tuple([canonical(v) for v in key])



# Values whose == says less than ``same`` does: JSON (true == 1 inside it), and times of day
# with a zone (equal at different offsets).
_NOT_AS_GIVEN = frozenset({dict, list, time})


def equal_as_given(source: Sequence[StoredRow], store: Sequence[StoredRow]) -> bool:
    """Whether the two sides of a chunk are equal by Python's == on the rows as they are given
    (each side's keys and values), a check without canonical forms. Where it says so, the
    canonical forms are ``same`` too: == tells apart what ``canonical`` does, but for equal
    numbers of other types (1, 1.0, Decimal("1.00"), True) and infinity as a float and as a
    Decimal, which ``same`` equates as well. False says nothing: compare the canonical forms."""
    if len(source) != len(store):
        return False
    kinds = {type(value) for row in source for value in row.row.values()}
    if kinds & _NOT_AS_GIVEN:
        return False
    return {row.key: row.row for row in source} == {row.key: row.row for row in store}


def by_key(rows: Iterable[StoredRow]) -> dict[tuple, Row]:
    return {canonical_key(r.key): canonical_row(r.row) for r in rows}


@dataclass(frozen=True)
class ChunkDiff:
    """Keys of one chunk: in the source only, in the store only, in both with other values."""

    missing: list[tuple]
    extra: list[tuple]
    different: list[tuple]

    @property
    def keys(self) -> list[tuple]:
        return sorted([*self.missing, *self.extra, *self.different], key=key_order)

    def __bool__(self) -> bool:
        return bool(self.missing or self.extra or self.different)


def compare(source: dict[tuple, Row], store: dict[tuple, Row]) -> ChunkDiff:
    """What differs between the two sides of a chunk (canonical rows by canonical key)."""
    order = key_order
    return ChunkDiff(missing=sorted((k for k in source if k not in store), key=order),
                     extra=sorted((k for k in store if k not in source), key=order),
                     different=sorted((k for k in source if k in store and not same_row(source[k], store[k])),
                                      key=order))


@dataclass
class Finding:
    """A key that differs: its values on each side (None: the side has no such row)."""

    key: list
    source: dict | None
    store: dict | None


@dataclass
class TableReport:
    """What ``cdc verify`` found for one table. The lists hold the first ``shown`` keys of each
    kind; the counts are complete."""

    table: str
    topic: str
    rows: int = 0                 # source rows compared
    store_rows: int = 0           # store rows compared
    chunks: int = 0
    chunks_differing: int = 0     # chunks whose sides differed (then compared key by key)
    chunks_digested: int = 0      # chunks both databases digested, equal without a row read (cdc/api/digest.py)
    missing: list[Finding] = field(default_factory=list)
    extra: list[Finding] = field(default_factory=list)
    different: list[Finding] = field(default_factory=list)
    unsettled: list[Finding] = field(default_factory=list)  # not decided: still changing, or the store not settled
    counts: dict[str, int] = field(default_factory=lambda: {"missing": 0, "extra": 0, "different": 0,
                                                             "unsettled": 0})
    seconds: float = 0.0
    settled: bool = True          # False: a wait for the store to apply the log timed out (its keys: unsettled)
    shown: int = 10
    repairable: list[tuple] = field(default_factory=list)  # every missing or different key (canonical)

    def add(self, kind: str, finding: Finding) -> None:
        self.counts[kind] += 1
        if kind in ("missing", "different"):
            self.repairable.append(tuple(finding.key))
        found: list[Finding] = getattr(self, kind)
        if len(found) < self.shown:
            found.append(finding)

    @property
    def mismatched(self) -> int:
        """Keys reported as differing (missing, extra or different; not the unsettled)."""
        return self.counts["missing"] + self.counts["extra"] + self.counts["different"]

    @property
    def equal(self) -> bool:
        """Known equal: no key differs and none was left undecided."""
        return self.mismatched == 0 and self.counts["unsettled"] == 0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["shown"], out["repairable"]
        out["rows_per_s"] = round(self.rows_per_s, 1)
        out["seconds"] = round(self.seconds, 3)
        out["equal"] = self.equal
        return out

    def lines(self) -> list[str]:
        """The report for people."""
        verdict = f"{self.mismatched} keys differ" if self.mismatched else \
            f"not decided, {self.counts['unsettled']} keys unsettled" if self.counts["unsettled"] else "equal"
        out = [f"{self.table} ({self.topic}): {verdict}; {self.rows:,} source rows and {self.store_rows:,} store "
               f"rows in {self.chunks} chunks ({self.chunks_digested} by digest, {self.chunks_differing} key by key), "
               f"{self.seconds:.1f}s, {self.rows_per_s:,.0f} source rows/s"]
        if not self.settled:
            out.append("  the store did not apply the log within the settle timeout: the keys not yet equal are "
                       "unsettled, not known to differ (is the sink running?)")
        for kind in ("missing", "extra", "different", "unsettled"):
            count, found = self.counts[kind], getattr(self, kind)
            if not count:
                continue
            more = f" (the first {len(found)})" if count > len(found) else ""
            out.append(f"  {kind} {count}{more}:")
            for f in found:
                key = _show(f.key[0] if len(f.key) == 1 else f.key)
                if kind == "missing":
                    out.append(f"    key {key}: source {_show(f.source)}")
                elif kind == "extra":
                    out.append(f"    key {key}: store {_show(f.store)}")
                else:
                    out.append(f"    key {key}: source {_show(f.source)} != store {_show(f.store)}")
        return out


def _show(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()
