"""Did a sink ever show a row going back? The pure logic of the sampler in bench/incremental_verify.py.

The sampler reads the same keys from a sink's store again and again while the source changes
under an incremental snapshot, and hands each reading to ``RegressionCheck.observe``. What the
writer of the source guarantees, so that "back" is decidable from readings alone:

* a row's value ``v`` only grows: every write sets it from one counter that only goes up
  (an update, a primary-key change to a new key, and the insert of a key again after it was
  deleted alike);
* a key that was deleted comes back only through an insert the writer noted before it
  committed it (``reinserts``: key -> the values it inserted the key again with).

A regression is then any of:

* a row shown with a lower version or a lower value than the sink showed for it before;
* a row shown again after the sink showed it deleted, unless the source inserted the key again
  after that delete (a re-insert with a value above the one last seen before the delete, and at
  most the value shown now), and with a version above the one it had before the delete.

A key the sink never showed is not yet there (a snapshot chunk or a change has not reached it),
so its absence says nothing; absence after presence is a delete the sink applied.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Shown:
    """A row as the sink showed it: its ``__cdc_version`` and its value ``v``."""

    version: int
    value: int


@dataclass
class RegressionCheck:
    present: dict[Hashable, Shown] = field(default_factory=dict)  # last shown, per key shown present
    deleted: dict[Hashable, Shown] = field(default_factory=dict)  # last shown before the sink deleted it
    regressions: list[str] = field(default_factory=list)
    readings: int = 0

    def observe(self, key: Hashable, row: Shown | None, reinserts: Mapping[Hashable, Sequence[int]]) -> None:
        """One reading of ``key`` (None: the sink has no such row now)."""
        self.readings += 1
        if row is None:
            if key in self.present:
                self.deleted[key] = self.present.pop(key)
            return
        before = self.present.get(key)
        if before is not None:
            if row.version < before.version or row.value < before.value:
                self.regressions.append(f"key {key!r} went back: {before} shown, then {row}")
        elif key in self.deleted:
            gone = self.deleted.pop(key)
            inserted_again = any(gone.value < value <= row.value for value in reinserts.get(key, ()))
            if not inserted_again or row.version <= gone.version:
                self.regressions.append(f"key {key!r} came back after the sink deleted it ({gone} before the "
                                        f"delete, then {row}; the source inserted it again with "
                                        f"{list(reinserts.get(key, ())) or 'nothing'})")
        self.present[key] = row

    def observe_all(self, keys: Sequence[Hashable], shown: Mapping[Hashable, Shown],
                    reinserts: Mapping[Hashable, Sequence[int]]) -> None:
        """One reading of ``keys``: those not in ``shown`` are absent from the sink."""
        for key in keys:
            self.observe(key, shown.get(key), reinserts)
