"""MariaDB GTID positions: the last ``domain-server-seq`` applied in each replication domain.

https://mariadb.com/kb/en/gtid/ : a replica's position is one GTID per domain (``0-1-57,1-2-9``),
and a server resumes a dump "after" it (``@slave_connect_state``). Sequence numbers increase
within a domain, whichever server wrote them, so a position is covered by another when each of
its domains has a sequence number no higher than the other's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class GtidPosition:
    domains: dict[int, tuple[int, int]] = field(default_factory=dict)   # domain -> (server id, seq no)

    @classmethod
    def parse(cls, text: str | None) -> GtidPosition:
        position = cls()
        for part in (text or "").replace(" ", "").split(","):
            if not part:
                continue
            try:
                domain, server, seq = (int(x) for x in part.split("-"))
            except ValueError:
                raise ValueError(f"not a MariaDB GTID: {part!r} (expected domain-server-sequence)") from None
            position.domains[domain] = (server, seq)
        return position

    def advance(self, domain: int, server: int, seq: int) -> None:
        self.domains[domain] = (server, seq)

    def covered_by(self, other: GtidPosition) -> bool:
        """True when every transaction up to ``self`` is also up to ``other``."""
        return all(domain in other.domains and other.domains[domain][1] >= seq
                   for domain, (_, seq) in self.domains.items())

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, (s, n) in sorted(self.domains.items()))
