"""Bad rows collected while a table streams, reported in one error that names them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from airflow_batch_provider.exceptions import InvalidInputError

MAX_ROWS_NAMED = 20


@dataclass
class RowProblems:
    """Collect bad rows by kind while streaming; raise one InvalidInputError naming them at the end."""

    limit: int = MAX_ROWS_NAMED
    _rows: dict[str, list[int]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)
    _advice: dict[str, str] = field(default_factory=dict)
    _details: dict[str, list[str]] = field(default_factory=dict)

    def add(
        self, kind: str, positions: Iterable[int] | np.ndarray, advice: str = "", details: Sequence[str] = ()
    ) -> None:
        """Record table positions (0-based) that have problem ``kind`` (e.g. "null in column 'title'").

        ``details`` are extra lines shown under the kind (at most ``limit`` are kept).
        """
        if isinstance(positions, np.ndarray):
            count = int(positions.size)
            head = [int(p) for p in positions[: self.limit]]
        else:
            items = list(positions)
            count, head = len(items), [int(p) for p in items[: self.limit]]
        if not count:
            return
        kept = self._rows.setdefault(kind, [])
        kept.extend(head[: self.limit - len(kept)])
        self._counts[kind] = self._counts.get(kind, 0) + count
        if advice:
            self._advice[kind] = advice
        if details:
            kept_details = self._details.setdefault(kind, [])
            kept_details.extend(details[: self.limit - len(kept_details)])

    def __bool__(self) -> bool:
        return bool(self._counts)

    @property
    def rows(self) -> list[int]:
        """Return the named row positions of every kind, sorted."""
        return sorted({r for rows in self._rows.values() for r in rows})

    def message(self) -> str:
        """Return one paragraph per problem kind, naming rows and the total count."""
        parts = []
        for kind, count in self._counts.items():
            shown = ", ".join(str(r) for r in self._rows[kind])
            more = f" (first {len(self._rows[kind])} shown)" if count > len(self._rows[kind]) else ""
            advice = f" {self._advice[kind]}" if kind in self._advice else ""
            parts.append(f"{kind}: {count:,} row(s) at position {shown}{more}.{advice}")
            parts.extend(f"  - {line}" for line in self._details.get(kind, ()))
        return "\n".join(parts)

    def raise_if_any(self, what: str = "The input table") -> None:
        """Raise InvalidInputError listing every recorded problem, if there is one."""
        if self:
            raise InvalidInputError(
                f"{what} has rows that cannot be turned into requests (positions are 0-based):\n{self.message()}",
                rows=self.rows,
            )
