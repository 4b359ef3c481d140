"""Synthetic input tables for the example DAGs, the demo and the benchmarks.

Deterministic: the same row count always gives the same table, so demo runs are comparable.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.utils.storage import atomic_write, join, makedirs, to_path

_ADJECTIVES = ["compact", "deluxe", "eco", "classic", "smart", "portable", "premium", "vintage", "ultra", "mini"]
_ITEMS = [
    ("wireless headphones", "noise-cancelling over-ear headphones with 30 h battery"),
    ("running shoes", "lightweight trainers with breathable mesh upper"),
    ("chef knife", "8-inch stainless steel kitchen knife with ergonomic handle"),
    ("yoga mat", "non-slip 6 mm exercise mat with carrying strap"),
    ("building blocks", "500-piece construction set for ages 6 and up"),
    ("face serum", "vitamin C serum for brighter skin, 30 ml"),
    ("mystery novel", "paperback thriller set in a snowbound mountain hotel"),
    ("green tea", "organic loose-leaf sencha, 250 g tin"),
    ("smartwatch", "fitness tracker with heart-rate and GPS"),
    ("rain jacket", "waterproof shell with taped seams and hood"),
    ("coffee grinder", "burr grinder with 15 grind settings"),
    ("tennis racket", "graphite racket, 100 sq in head, strung"),
]
_COLOURS = ["black", "white", "red", "blue", "green", "grey", "navy", "sand"]


_BLOCK = 65_536


def _draws(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random columns drawn block by block, so a longer table starts with the shorter one."""
    parts: list[tuple[np.ndarray, ...]] = []
    for block in range(-(-rows // _BLOCK)):
        rng = np.random.default_rng([seed, block])
        parts.append(
            (
                rng.integers(0, len(_ADJECTIVES), _BLOCK),
                rng.integers(0, len(_ITEMS), _BLOCK),
                rng.integers(0, len(_COLOURS), _BLOCK),
                np.round(rng.uniform(3, 400, _BLOCK), 2),
            )
        )
    adj, item, colour, price = (np.concatenate([p[k] for p in parts])[:rows] for k in range(4))
    return adj, item, colour, price


def synthetic_products(rows: int, seed: int = 7) -> pa.Table:
    """Return ``rows`` synthetic products: product_id, title, description, price.

    Prefix-stable: the first N rows are the same whatever the total, so "add 1,000 rows" is
    a bigger table whose first rows did not change.
    """
    adj, item, colour, price = _draws(rows, seed)
    titles = [f"{_ADJECTIVES[a].title()} {_COLOURS[c]} {_ITEMS[i][0]}" for a, i, c in zip(adj, item, colour)]
    descriptions = [f"{_ITEMS[i][1]}; colour {_COLOURS[c]}." for i, c in zip(item, colour)]
    ids = [f"p-{n:08d}" for n in range(rows)]
    return pa.table({"product_id": ids, "title": titles, "description": descriptions, "price": price})


def write_synthetic_products(rows: int, data_dir: str) -> str:
    """Write (once) the synthetic product table for ``rows`` under ``data_dir``; return its path."""
    makedirs(data_dir)
    path = join(data_dir, f"products_{rows}.parquet")
    if not to_path(path).exists():
        with atomic_write(path) as out:
            pq.write_table(synthetic_products(rows), out)
    return path
