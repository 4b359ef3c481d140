"""Synthetic inputs for the benchmarks: a product table and provider output files, cached on disk.

The table has short chat prompts (a title and a one-line description per row, like the example
DAG's products). Output files are what the OpenAI Batch API (and the emulator) write: one
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` line per
request, in shuffled order, one file per chunk. Everything is deterministic, so a cached file is
the file a fresh run would write.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".demo" / "bench"
DATA_VERSION = 1  # bump when the generated data changes, so stale caches are rebuilt

# The request every row becomes: the example DAG's prompt without structured output.
LABELS = ["electronics", "clothing", "home", "sports", "toys", "beauty", "books", "grocery"]
PROMPT = (
    "Classify this product into exactly one category.\n"
    f"Labels: {', '.join(LABELS)}\n"
    "Product: {title}\n"
    "Description: {description}"
)
SYSTEM_PROMPT = "You are a careful retail catalogue assistant."
MODEL = "gpt-4o-mini"
ENDPOINT = "/v1/chat/completions"
PARAMS: dict[str, Any] = {"max_tokens": 64, "temperature": 0}
ID_COLUMN = "product_id"
CHUNK_SIZE = 10_000

# A copy of the demo data's vocabulary (airflow_batch_emulator/examples.py) on purpose: importing it pulls in
# Airflow, and the reference paths must run (and be measured) without it.
_ADJECTIVES = ["Compact", "Deluxe", "Eco", "Classic", "Smart", "Portable", "Premium", "Vintage", "Ultra", "Mini"]
_COLOURS = ["black", "white", "red", "blue", "green", "grey", "navy", "sand"]
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


def request_dict(custom_id: str, text: str) -> dict[str, Any]:
    """Return one row's request as the reference loop builds it (the OpenAI batch input format)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": MODEL, "messages": messages, **PARAMS},
    }


def products_table(rows: int, seed: int = 7) -> pa.Table:
    """Return ``rows`` synthetic products: product_id, title, description, price (vectorised)."""
    rng = np.random.default_rng(seed)
    adjective = rng.integers(0, len(_ADJECTIVES), rows)
    colour = rng.integers(0, len(_COLOURS), rows)
    item = rng.integers(0, len(_ITEMS), rows)
    # Every (adjective, colour, item) title and (item, colour) description once, then picked per row.
    titles = pa.array([f"{a} {c} {i} #{n}" for a in _ADJECTIVES for c in _COLOURS for i, _ in _ITEMS for n in range(4)])
    descriptions = pa.array([f"{d}; colour {c}." for _, d in _ITEMS for c in _COLOURS])
    variant = rng.integers(0, 4, rows)
    title_index = ((adjective * len(_COLOURS) + colour) * len(_ITEMS) + item) * 4 + variant
    ids = pc.binary_join_element_wise("p-", pc.utf8_lpad(pa.array(np.arange(rows)).cast(pa.string()), 9, "0"), "")
    return pa.table(
        {
            ID_COLUMN: ids,
            "title": titles.take(pa.array(title_index)),
            "description": descriptions.take(pa.array(item * len(_COLOURS) + colour)),
            "price": np.round(rng.uniform(3, 400, rows), 2),
        }
    )


def write_products(rows: int, folder: Path = BENCH_DIR) -> Path:
    """Write (once) the product table of ``rows`` rows as parquet under ``folder``; return its path."""
    path = folder / f"products-{rows}-v{DATA_VERSION}.parquet"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        pq.write_table(products_table(rows), tmp, row_group_size=128 * 1024)
        tmp.replace(path)
    return path


def _output_line(custom_id: str, created: int) -> bytes:
    """Return the OpenAI batch output line answering ``custom_id`` (as the emulator writes it)."""
    key = hashlib.blake2b(custom_id.encode(), digest_size=16).digest()
    label = LABELS[key[0] % len(LABELS)]
    prompt, completion = 40 + key[1] % 20, 1 + key[2] % 3
    body = {
        "id": "chatcmpl-" + key.hex()[:29],
        "object": "chat.completion",
        "created": created,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": label, "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
        "service_tier": "default",
        "system_fingerprint": "fp_emulator",
    }
    response = {"status_code": 200, "request_id": "req_" + key.hex()[::-1], "body": body}
    return orjson.dumps({"id": "batch_req_" + key.hex(), "custom_id": custom_id, "response": response, "error": None})


def write_outputs(manifest: list[dict[str, Any]], folder: Path) -> list[Path]:
    """Write (once) one shuffled output file per chunk of ``manifest``; return their paths in chunk order.

    The files answer every request of the chunk's rows file. A stamp of the chunk fingerprints
    decides whether a cached folder still matches the chunks.
    """
    stamp = hashlib.sha256(f"v{DATA_VERSION}".encode() + "".join(d["fingerprint"] for d in manifest).encode())
    stamp_file = folder / "_STAMP"
    paths = [folder / f"chunk-{d['chunk_index']:05d}.output.jsonl" for d in manifest]
    if stamp_file.exists() and stamp_file.read_text() == stamp.hexdigest() and all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    stamp_file.unlink(missing_ok=True)
    created = 1_767_225_600
    for descriptor, path in zip(manifest, paths, strict=True):
        custom_ids = pq.read_table(descriptor["rows_path"], columns=["custom_id"]).column(0).to_pylist()
        lines = [_output_line(custom_id, created) for custom_id in custom_ids]
        random.Random(descriptor["chunk_index"]).shuffle(lines)  # providers answer in any order
        path.write_bytes(b"\n".join(lines) + b"\n")
    stamp_file.write_text(stamp.hexdigest())
    return paths
