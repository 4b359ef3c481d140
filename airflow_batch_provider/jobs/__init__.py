"""Job folders over time: what a run keeps once it has merged, and ``gc`` for the rest (docs/retention.md)."""
