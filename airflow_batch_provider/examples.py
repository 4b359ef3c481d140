"""Synthetic input tables for the example DAGs, the demo and the benchmarks.

Deterministic: the same row count always gives the same table, so demo runs are comparable.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_batch_provider.storage import atomic_write, join, makedirs, to_path

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


def synthetic_products(rows: int, seed: int = 7) -> pa.Table:
    """Return ``rows`` synthetic products: product_id, title, description, price."""
    rng = np.random.default_rng(seed)
    adj = rng.integers(0, len(_ADJECTIVES), rows)
    item = rng.integers(0, len(_ITEMS), rows)
    colour = rng.integers(0, len(_COLOURS), rows)
    price = np.round(rng.uniform(3, 400, rows), 2)
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
