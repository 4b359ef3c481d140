"""The duplicate check's hash collector finds the same repeats in memory and spilled to disk."""

from __future__ import annotations

import os

import numpy as np

from airflow_batch_provider.chunking.id_hashes import IdHashes


def _batches(seed: int) -> tuple[list[np.ndarray], set[int]]:
    rng = np.random.default_rng(seed)
    values = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=50_000, dtype=np.int64)
    repeats = values[[7, 1_234, 49_999]]
    values = np.concatenate([values, repeats, repeats[:1]])  # three repeated values, one of them three times
    rng.shuffle(values)
    return np.array_split(values, 37), {int(v) for v in repeats}


def test_in_memory_and_spilled_find_the_same_repeats() -> None:
    batches, expected = _batches(1)
    in_memory, spilled = IdHashes(spill_rows=10**9), IdHashes(spill_rows=5_000)
    for batch in batches:
        in_memory.add(batch.copy())
        spilled.add(batch.copy())
    assert spilled._folder is not None  # it did spill: past 5,000 rows the hashes went to bucket files
    folder = spilled._folder.name
    assert in_memory.repeated() == expected
    assert spilled.repeated() == expected
    assert not os.path.exists(folder)  # the temporary files are gone once the check has run


def test_no_repeats_and_cleanup_after_an_error() -> None:
    hashes = IdHashes(spill_rows=10)
    hashes.add(np.arange(100, dtype=np.int64))
    assert hashes._folder is not None
    folder = hashes._folder.name
    hashes.close()  # what the chunk step does when the table fails validation
    assert not os.path.exists(folder)
    assert IdHashes().repeated() == set()
