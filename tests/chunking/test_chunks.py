"""The chunk step against real files: validation, limits, formats, determinism and the rows files."""

from __future__ import annotations

import gzip
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from airflow_batch_provider.chunking import writer
from airflow_batch_provider.chunking.chunks import build_chunks, check_map_length
from airflow_batch_provider.chunking.ids import derive_custom_id
from airflow_batch_provider.chunking.spec import RequestSpec, renderer_for
from airflow_batch_provider.descriptors import ChunkDescriptor
from airflow_batch_provider.exceptions import ChunkLimitError, InvalidInputError
from airflow_batch_provider.job_folder import CHUNKS_DIR, MANIFEST_NAME
from tests.chunking.reference import fingerprint, render_many

TEMPLATE = "Classify this product: {title}\n{description}"
OPENAI = RequestSpec(provider="openai", model="gpt-4o-mini", system_prompt="Be brief.", params={"max_tokens": 5})
ANTHROPIC = RequestSpec(provider="anthropic", model="claude-haiku-4-5", params={"max_tokens": 16})


def write_chunks(*args: Any, **kwargs: Any) -> list[ChunkDescriptor]:
    """Run the chunk step and return only its descriptors."""
    return build_chunks(*args, **kwargs).descriptors


def products(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "product_id": [f"p{i:06d}" for i in range(start, start + n)],
            "title": [f'Product {i} "quoted" é' for i in range(start, start + n)],
            "description": [f"Line one {i % 7}\nline two 😀" for i in range(start, start + n)],
            "price": [i * 10 for i in range(start, start + n)],
        }
    )


def save(table: pa.Table, path: Path) -> Path:
    """Write ``table`` as parquet, csv, csv.gz or jsonl according to the file name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith((".parquet", ".pq")):
        pq.write_table(table, path)
    elif name.endswith(".csv"):
        pacsv.write_csv(table, path)
    elif name.endswith(".csv.gz"):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table, sink)
        path.write_bytes(gzip.compress(sink.getvalue().to_pybytes()))
    else:
        path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in table.to_pylist()))
    return path


def leftovers(job: Path) -> list[str]:
    """Return everything under ``job`` (nothing must be left after a failed run)."""
    if not job.exists():
        return []
    return sorted(str(p.relative_to(job)) for p in job.rglob("*"))


def read_lines(descriptors: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for d in descriptors for line in Path(d["requests_path"]).read_bytes().splitlines()]


def chunk_bytes(job: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((job / CHUNKS_DIR).iterdir())}


# ----------------------------------------------------------------------------------- bad input


def _with(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type))


BASE = products(6)
BAD_CASES: list[Any] = [
    pytest.param(
        _with(BASE, "product_id", ["a", "b", "c", "a", "d", "b"]),
        {"id_column": "product_id"},
        InvalidInputError,
        ["duplicate id in column 'product_id'", "2 row(s)", "id 'a' at rows 0 and 3", "id 'b' at rows 1 and 5"],
        id="duplicate-ids",
    ),
    pytest.param(
        pa.concat_tables([BASE.slice(0, 3), BASE.slice(1, 1)]),
        {},
        InvalidInputError,
        ["duplicate row", "rows 1 and 3 are identical", "pass id_column"],
        id="identical-rows-without-id-column",
    ),
    pytest.param(
        _with(BASE, "product_id", ["a", None, "c", "", "e", "f"]),
        {"id_column": "product_id"},
        InvalidInputError,
        ["null, NaN or empty id in column 'product_id'", "2 row(s) at position 1, 3"],
        id="null-and-empty-ids",
    ),
    pytest.param(
        BASE,
        {"template": "{title} {colour} {size}"},
        InvalidInputError,
        ["['colour', 'size']", "available columns: ['product_id', 'title', 'description', 'price']"],
        id="missing-template-columns",
    ),
    pytest.param(
        BASE, {"id_column": "sku"}, InvalidInputError, ["id_column 'sku'", "available columns"], id="missing-id-column"
    ),
    pytest.param(
        _with(BASE, "title", ["t", None, "t", "t", None, "t"]),
        {"id_column": "product_id"},
        InvalidInputError,
        ["null in column 'title': 2 row(s) at position 1, 4", "Fill or filter"],
        id="null-prompt-values",
    ),
    pytest.param(
        _with(_with(BASE, "title", ["t", " ", "t", "", "t", "t"]), "description", ["d", "\n", "d", "", "d", "d"]),
        {"id_column": "product_id", "template": "{title}{description}"},
        InvalidInputError,
        ["empty or whitespace-only prompt: 2 row(s) at position 1, 3"],
        id="blank-prompts",
    ),
    pytest.param(BASE.slice(0, 0), {}, InvalidInputError, ["has no rows"], id="empty-table"),
    pytest.param(
        _with(BASE, "description", ["short", "short", "x" * 5000, "short", "short", "short"]),
        {"id_column": "product_id", "byte_cap": 2000},
        ChunkLimitError,
        ["Row 2", "'p000002'", "bytes, more than the chunk byte cap of 2,000 bytes"],
        id="request-over-byte-cap",
    ),
    pytest.param(BASE, {"chunk_size": 0}, InvalidInputError, ["chunk_size", "got 0"], id="chunk-size-zero"),
    pytest.param(
        BASE, {"chunk_size": 50_001}, InvalidInputError, ["1 to 50,000", "got 50001"], id="chunk-size-over-openai-max"
    ),
    pytest.param(
        BASE,
        {"chunk_size": 100_001, "spec": ANTHROPIC},
        InvalidInputError,
        ["1 to 100,000", "got 100001"],
        id="chunk-size-over-anthropic-max",
    ),
    pytest.param(
        BASE, {"byte_cap": 300 * 1024 * 1024}, InvalidInputError, ["byte_cap", "314572800"], id="byte-cap-over-max"
    ),
    pytest.param(
        _with(BASE, "product_id", ["a", "b" * 513, "c", "d", "e" * 600, "f"]),
        {"id_column": "product_id"},
        InvalidInputError,
        ["id longer than 512 characters in column 'product_id': 2 row(s) at position 1, 4"],
        id="id-too-long",
    ),
    pytest.param(
        BASE.append_column("request_fingerprint", pa.array(["x"] * 6)),
        {},
        InvalidInputError,
        ["'request_fingerprint'", "rename"],
        id="reserved-column",
    ),
    pytest.param(
        BASE,
        {"template": "{price:.2f} {title:>5d}"},
        InvalidInputError,
        ["cannot format", "ValueError"],
        id="format-error",
    ),
]


@pytest.mark.parametrize(("table", "kwargs", "error", "fragments"), BAD_CASES)
def test_bad_input_is_rejected_and_leaves_nothing(
    tmp_path: Path, table: pa.Table, kwargs: dict[str, Any], error: type[Exception], fragments: list[str]
) -> None:
    source = save(table, tmp_path / "in.parquet")
    job = tmp_path / "job"
    options = dict(kwargs)
    spec = options.pop("spec", OPENAI)
    template = options.pop("template", TEMPLATE)
    with pytest.raises(error) as info:
        write_chunks(source, job, spec, template, batch_rows=2, **options)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message
    assert leftovers(job) == []


def test_corrupt_parquet_is_named(tmp_path: Path) -> None:
    source = tmp_path / "broken.parquet"
    source.write_bytes(b"PAR1 this is not really parquet")
    job = tmp_path / "job"
    with pytest.raises(InvalidInputError, match=r"Cannot read .*broken\.parquet as parquet"):
        write_chunks(source, job, OPENAI, TEMPLATE)
    assert leftovers(job) == []


def test_truncated_parquet_is_named(tmp_path: Path) -> None:
    good = save(products(100), tmp_path / "good.parquet").read_bytes()
    source = tmp_path / "cut.parquet"
    source.write_bytes(good[: len(good) // 2])
    with pytest.raises(InvalidInputError, match=r"cut\.parquet"):
        write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        pytest.param(lambda p: p / "missing.parquet", "does not exist", id="missing-file"),
        pytest.param(
            lambda p: (p / "t.xlsx").write_bytes(b"x") and p / "t.xlsx", "Cannot tell the format", id="unknown-ext"
        ),
        pytest.param(lambda p: (p / "empty").mkdir() or p / "empty", "holds no table files", id="empty-folder"),
    ],
)
def test_unreadable_sources(tmp_path: Path, make: Callable[[Path], Path], fragment: str) -> None:
    with pytest.raises(InvalidInputError, match=fragment):
        write_chunks(make(tmp_path), tmp_path / "job", OPENAI, TEMPLATE)
    assert leftovers(tmp_path / "job") == []


def test_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"title": "a", "description": "b"}\n{"title": "c", broken\n')
    with pytest.raises(InvalidInputError, match=r"Cannot read .*in\.jsonl as jsonl"):
        write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE)
    assert leftovers(tmp_path / "job") == []


def test_file_urls_work_for_source_and_job_dir(tmp_path: Path) -> None:
    source = save(products(5), tmp_path / "in.parquet")
    descriptors = write_chunks(f"file://{source}", f"file://{tmp_path / 'job'}", OPENAI, TEMPLATE)
    assert descriptors[0]["requests_path"] == str(tmp_path / "job" / CHUNKS_DIR / "chunk-00000.jsonl")
    assert len(read_lines(descriptors)) == 5


def test_many_bad_rows_name_the_first_20_and_the_total(tmp_path: Path) -> None:
    table = products(100)
    titles = [None if i % 3 == 0 else "t" for i in range(100)]
    source = save(_with(table, "title", titles), tmp_path / "in.parquet")
    with pytest.raises(InvalidInputError) as info:
        write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE, id_column="product_id", batch_rows=7)
    message = str(info.value)
    assert "34 row(s) at position 0, 3, 6," in message
    assert "57 (first 20 shown)" in message
    assert info.value.rows[:3] == [0, 3, 6]


def test_late_error_keeps_the_previous_chunks(tmp_path: Path) -> None:
    job = tmp_path / "job"
    good = save(products(1000), tmp_path / "good.parquet")
    write_chunks(good, job, OPENAI, TEMPLATE, id_column="product_id", chunk_size=100)
    before = chunk_bytes(job)
    ids = [f"p{i}" for i in range(1000)]
    ids[990] = ids[3]
    bad = save(_with(products(1000), "product_id", ids), tmp_path / "bad.parquet")
    with pytest.raises(InvalidInputError, match="id 'p3' at rows 3 and 990"):
        write_chunks(bad, job, OPENAI, TEMPLATE, id_column="product_id", chunk_size=100, batch_rows=64)
    assert chunk_bytes(job) == before
    assert sorted(p.name for p in job.iterdir()) == [CHUNKS_DIR]


# ---------------------------------------------------------------------------------- chunking


def test_count_limit_cuts_contiguous_chunks_across_batches(tmp_path: Path) -> None:
    table = products(95)
    source = save(table, tmp_path / "in.parquet")
    descriptors = write_chunks(
        source, tmp_path / "job", OPENAI, TEMPLATE, id_column="product_id", chunk_size=10, batch_rows=7
    )
    assert [d["num_requests"] for d in descriptors] == [10] * 9 + [5]
    assert [d["chunk_index"] for d in descriptors] == list(range(10))
    assert {d["num_chunks"] for d in descriptors} == {10}
    assert descriptors[2]["label"] == "chunk 3/10 (10 req)"
    lines = read_lines(descriptors)
    assert [line["custom_id"] for line in lines] == table.column("product_id").to_pylist()
    rows = pa.concat_tables([pq.read_table(d["rows_path"]) for d in descriptors])
    assert rows.column("custom_id").to_pylist() == table.column("product_id").to_pylist()
    assert rows.select(table.schema.names).equals(table)


def test_byte_cap_forces_more_chunks_than_the_count_limit(tmp_path: Path) -> None:
    source = save(products(200), tmp_path / "in.parquet")
    descriptors = write_chunks(
        source,
        tmp_path / "job",
        OPENAI,
        TEMPLATE,
        id_column="product_id",
        chunk_size=100,
        byte_cap=5_000,
        batch_rows=33,
    )
    assert len(descriptors) > 2  # the count limit alone would give 2
    assert sum(d["num_requests"] for d in descriptors) == 200
    for d in descriptors:
        data = Path(d["requests_path"]).read_bytes()
        assert d["num_bytes"] == len(data) <= 5_000
        assert d["fingerprint"] == hashlib.sha256(data).hexdigest()
        assert data.endswith(b"\n") and b"\n\n" not in data and b"\r" not in data
        assert d["num_requests"] == data.count(b"\n")
    line_size = len(Path(descriptors[0]["requests_path"]).read_bytes().splitlines()[0]) + 1
    # Each full chunk is as full as the cap allows: one more line would not have fitted.
    for d in descriptors[:-1]:
        assert d["num_bytes"] + line_size > 5_000 - 10


def test_a_line_exactly_at_the_byte_cap_fits(tmp_path: Path) -> None:
    source = save(products(3), tmp_path / "in.parquet")
    first = write_chunks(source, tmp_path / "a", OPENAI, TEMPLATE, id_column="product_id")
    size = max(len(line) + 1 for line in Path(first[0]["requests_path"]).read_bytes().splitlines())
    descriptors = write_chunks(source, tmp_path / "b", OPENAI, TEMPLATE, id_column="product_id", byte_cap=size)
    assert [d["num_requests"] for d in descriptors] == [1, 1, 1]


# ----------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("id_column", ["product_id", None], ids=["id-column", "hashed-ids"])
def test_csv_jsonl_parquet_give_identical_chunk_files(tmp_path: Path, id_column: str | None) -> None:
    table = products(250)
    outputs = []
    for name in ("in.parquet", "in.csv", "in.jsonl", "in.csv.gz", "in.ndjson", "in.pq"):
        source = save(table, tmp_path / "src" / name)
        descriptors = write_chunks(
            source, tmp_path / name, OPENAI, TEMPLATE, id_column=id_column, chunk_size=60, batch_rows=50
        )
        outputs.append([Path(d["requests_path"]).read_bytes() for d in descriptors])
        rows = pa.concat_tables([pq.read_table(d["rows_path"]) for d in descriptors])
        assert rows.column("title").to_pylist() == table.column("title").to_pylist()
    assert all(out == outputs[0] for out in outputs[1:])
    assert len(outputs[0]) == 5


def test_folder_of_parquet_files_equals_the_single_file(tmp_path: Path) -> None:
    table = products(120)
    save(table.slice(0, 50), tmp_path / "dataset" / "part-0.parquet")
    save(table.slice(50, 70), tmp_path / "dataset" / "sub" / "part-1.parquet")
    (tmp_path / "dataset" / "_SUCCESS").write_bytes(b"")
    single = save(table, tmp_path / "single.parquet")
    from_folder = write_chunks(tmp_path / "dataset", tmp_path / "j1", OPENAI, TEMPLATE, chunk_size=40)
    from_file = write_chunks(single, tmp_path / "j2", OPENAI, TEMPLATE, chunk_size=40)
    assert [Path(d["requests_path"]).read_bytes() for d in from_folder] == [
        Path(d["requests_path"]).read_bytes() for d in from_file
    ]


def test_csv_keeps_the_spelling_of_ids_and_prompt_values(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    source.write_text('sku,title,qty,stock\n00123,"1.50",3,7\n00124,"multi\nline",4,8\n')
    descriptors = write_chunks(source, tmp_path / "job", OPENAI, "{title} x{qty}", id_column="sku")
    lines = read_lines(descriptors)
    assert [line["custom_id"] for line in lines] == ["00123", "00124"]
    assert [line["body"]["messages"][1]["content"] for line in lines] == ["1.50 x3", "multi\nline x4"]
    rows = pq.read_table(descriptors[0]["rows_path"])
    assert rows.schema.field("qty").type == pa.string()  # template columns are read as text
    assert rows.schema.field("stock").type == pa.int64()  # other columns keep csv type inference


def test_columns_limit_what_the_rows_files_keep(tmp_path: Path) -> None:
    source = save(products(5), tmp_path / "in.parquet")
    descriptors = write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE, id_column="product_id", columns=["price"])
    rows = pq.read_table(descriptors[0]["rows_path"])
    assert rows.schema.names == ["product_id", "title", "description", "price", "custom_id", "request_fingerprint"]
    descriptors = write_chunks(source, tmp_path / "job2", OPENAI, "{title}", columns=[])
    assert pq.read_table(descriptors[0]["rows_path"]).schema.names == ["title", "custom_id", "request_fingerprint"]
    with pytest.raises(InvalidInputError, match=r"columns \['colour'\] are not in the table"):
        write_chunks(source, tmp_path / "job3", OPENAI, TEMPLATE, columns=["colour"])


# ------------------------------------------------------------------------------------ content


def test_lines_round_trip_unicode_and_escapes(tmp_path: Path) -> None:
    texts = ['quote " backslash \\', "new\nline\r\ttab", "中文 😀 \u2028", "ctrl \x01\x1f", "{not a field}", "é" * 300]
    table = pa.table({"id": [f"r{i}" for i in range(len(texts))], "title": texts, "description": texts[::-1]})
    source = save(table, tmp_path / "in.parquet")
    descriptors = write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE, id_column="id")
    lines = read_lines(descriptors)
    for row, line in zip(table.to_pylist(), lines):
        assert line["body"]["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": TEMPLATE.format(**row)},
        ]
        assert line["custom_id"] == row["id"]


def test_rows_files_hold_source_columns_ids_and_fingerprints_but_no_bodies(tmp_path: Path) -> None:
    table = products(30)
    source = save(table, tmp_path / "in.parquet")
    descriptors = write_chunks(source, tmp_path / "job", OPENAI, TEMPLATE, id_column="product_id", chunk_size=12)
    renderer = renderer_for(OPENAI)
    rows = pa.concat_tables([pq.read_table(d["rows_path"]) for d in descriptors])
    assert rows.schema.names == [*table.schema.names, "custom_id", "request_fingerprint"]
    assert rows.num_rows == 30
    assert not any(isinstance(v, str) and "messages" in v for row in rows.to_pylist() for v in row.values())
    for row in rows.to_pylist():
        assert row["request_fingerprint"] == fingerprint(renderer, TEMPLATE.format(**row))
    assert [pq.read_metadata(d["rows_path"]).num_rows for d in descriptors] == [12, 12, 6]


def test_descriptors_and_manifest(tmp_path: Path) -> None:
    source = save(products(25), tmp_path / "in.parquet")
    job = tmp_path / "job"
    result = build_chunks(source, job, OPENAI, TEMPLATE, id_column="product_id", chunk_size=10)
    descriptors = result.descriptors
    assert result.num_rows == 25 and result.derived_ids == 0
    assert result.num_bytes == sum(d["num_bytes"] for d in descriptors)
    assert orjson.loads((job / CHUNKS_DIR / MANIFEST_NAME).read_bytes()) == descriptors
    assert sorted(p.name for p in (job / CHUNKS_DIR).iterdir()) == [
        "chunk-00000.jsonl",
        "chunk-00000.rows.parquet",
        "chunk-00001.jsonl",
        "chunk-00001.rows.parquet",
        "chunk-00002.jsonl",
        "chunk-00002.rows.parquet",
        MANIFEST_NAME,
    ]
    first = descriptors[0]
    assert first == {
        "job_dir": str(job),
        "chunk_index": 0,
        "num_chunks": 3,
        "provider": "openai",
        "endpoint": "/v1/chat/completions",
        "model": "gpt-4o-mini",
        "requests_path": str(job / CHUNKS_DIR / "chunk-00000.jsonl"),
        "rows_path": str(job / CHUNKS_DIR / "chunk-00000.rows.parquet"),
        "num_requests": 10,
        "num_bytes": (job / CHUNKS_DIR / "chunk-00000.jsonl").stat().st_size,
        "fingerprint": hashlib.sha256((job / CHUNKS_DIR / "chunk-00000.jsonl").read_bytes()).hexdigest(),
        "label": "chunk 1/3 (10 req)",
    }
    assert orjson.loads(orjson.dumps(descriptors)) == descriptors  # plain JSON for XCom


def test_rerun_is_deterministic_and_replaces_older_chunks(tmp_path: Path) -> None:
    source = save(products(300), tmp_path / "in.parquet")
    job = tmp_path / "job"
    first = write_chunks(source, job, OPENAI, TEMPLATE, chunk_size=50)
    first_bytes = chunk_bytes(job)
    second = write_chunks(source, job, OPENAI, TEMPLATE, chunk_size=50, batch_rows=17)
    assert second == first
    assert chunk_bytes(job) == first_bytes
    other = write_chunks(source, tmp_path / "other", OPENAI, TEMPLATE, chunk_size=50)
    assert [d["fingerprint"] for d in other] == [d["fingerprint"] for d in first]
    fewer = write_chunks(source, job, OPENAI, TEMPLATE, chunk_size=200)
    assert len(fewer) == 2
    assert sorted(p.name for p in (job / CHUNKS_DIR).iterdir()) == [
        "chunk-00000.jsonl",
        "chunk-00000.rows.parquet",
        "chunk-00001.jsonl",
        "chunk-00001.rows.parquet",
        MANIFEST_NAME,
    ]
    assert sorted(p.name for p in job.iterdir()) == [CHUNKS_DIR]


def test_leftovers_of_a_killed_attempt_are_removed(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / ".staging-0123").mkdir(parents=True)
    (job / ".staging-0123" / "chunk-00000.jsonl").write_bytes(b"{}\n")
    (job / ".old-chunks-4567").mkdir()
    (job / "keep.txt").write_bytes(b"user file")
    write_chunks(save(products(3), tmp_path / "in.parquet"), job, OPENAI, TEMPLATE)
    assert sorted(p.name for p in job.iterdir()) == [CHUNKS_DIR, "keep.txt"]


def test_hashed_ids_are_stable_and_compliant(tmp_path: Path) -> None:
    source = save(products(40), tmp_path / "in.parquet")
    lines = read_lines(write_chunks(source, tmp_path / "job", ANTHROPIC, TEMPLATE))
    ids = [line["custom_id"] for line in lines]
    assert all(re.fullmatch(r"row-[0-9a-f]{16}", i) for i in ids)
    assert len(set(ids)) == 40
    again = read_lines(write_chunks(source, tmp_path / "again", OPENAI, TEMPLATE))
    assert [line["custom_id"] for line in again] == ids  # ids depend on the row, not the provider


# ---------------------------------------------------------------------------- anthropic ids


def test_anthropic_ids_are_derived_when_they_do_not_fit(tmp_path: Path) -> None:
    user_ids = ["ok_id-1", "has space", "x" * 65, "ünïcode", "a/b", "x" * 64, "ok2"]
    table = pa.table({"id": user_ids, "title": ["t"] * 7, "description": [f"d{i}" for i in range(7)]})
    source = save(table, tmp_path / "in.parquet")
    result = build_chunks(source, tmp_path / "job", ANTHROPIC, TEMPLATE, id_column="id", batch_rows=3)
    lines = read_lines(result.descriptors)
    sent = [line["custom_id"] for line in lines]
    assert result.derived_ids == 4
    assert sent[0] == "ok_id-1" and sent[5] == "x" * 64 and sent[6] == "ok2"
    for index in (1, 2, 3, 4):
        assert sent[index] == derive_custom_id(user_ids[index])
        assert sent[index] == "h-" + hashlib.sha256(user_ids[index].encode()).hexdigest()[:40]
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", s) for s in sent)
    assert len(set(sent)) == len(sent)
    rows = pq.read_table(result.descriptors[0]["rows_path"])
    assert rows.column("id").to_pylist() == user_ids  # the user's column is unchanged
    assert rows.column("custom_id").to_pylist() == sent
    again = read_lines(write_chunks(source, tmp_path / "again", ANTHROPIC, TEMPLATE, id_column="id"))
    assert [line["custom_id"] for line in again] == sent


def test_anthropic_derived_id_colliding_with_a_user_id_is_a_duplicate(tmp_path: Path) -> None:
    derived = derive_custom_id("has space")
    table = pa.table({"id": ["has space", derived], "title": ["a", "b"], "description": ["c", "d"]})
    source = save(table, tmp_path / "in.parquet")
    with pytest.raises(InvalidInputError) as info:
        write_chunks(source, tmp_path / "job", ANTHROPIC, TEMPLATE, id_column="id")
    assert f"ids 'has space' (row 0) and '{derived}' (row 1) both become custom_id '{derived}'" in str(info.value)
    assert leftovers(tmp_path / "job") == []


def test_openai_keeps_long_and_unusual_ids(tmp_path: Path) -> None:
    user_ids = ["has space", "ü/é", "x" * 512]
    table = pa.table({"id": user_ids, "title": ["t"] * 3, "description": ["a", "b", "c"]})
    result = build_chunks(save(table, tmp_path / "in.parquet"), tmp_path / "job", OPENAI, TEMPLATE, id_column="id")
    assert [line["custom_id"] for line in read_lines(result.descriptors)] == user_ids
    assert result.derived_ids == 0


def test_integer_id_column_is_cast_to_text(tmp_path: Path) -> None:
    table = pa.table({"id": [10, 20], "title": ["a", "b"], "description": ["c", "d"]})
    descriptors = write_chunks(save(table, tmp_path / "in.parquet"), tmp_path / "job", OPENAI, TEMPLATE, id_column="id")
    assert [line["custom_id"] for line in read_lines(descriptors)] == ["10", "20"]


# ------------------------------------------------------------------------------ speed and scale


TRICKY = ["plain", 'quote " and \\ backslash', "nl\n tab\t cr\r bs\b ff\f", "nul \x00 \x01 \x1f", "é 😀 \u2028 \x7f"]


@pytest.mark.parametrize(
    ("spec", "id_column"),
    [
        pytest.param(OPENAI, "product_id", id="openai-id-column"),
        pytest.param(OPENAI, None, id="openai-hashed-ids"),
        pytest.param(ANTHROPIC, "product_id", id="anthropic-derived-ids"),
    ],
)
def test_chunk_files_equal_the_per_row_renderer_byte_for_byte(
    tmp_path: Path, spec: RequestSpec, id_column: str | None
) -> None:
    """The batch path (Arrow-built lines, escaped like orjson) writes exactly what render_many would."""
    n = 230
    table = (
        products(n)
        .set_column(1, "title", pa.array([f"{TRICKY[i % len(TRICKY)]} {i}" for i in range(n)]))
        .set_column(0, "product_id", pa.array([f"p {i} é" if i % 3 else f"p{i}" for i in range(n)]))
    )
    source = save(table, tmp_path / "in.parquet")
    descriptors = write_chunks(
        source, tmp_path / "job", spec, TEMPLATE, id_column=id_column, chunk_size=60, batch_rows=37
    )
    rows = pa.concat_tables([pq.read_table(d["rows_path"]) for d in descriptors])
    texts = [TEMPLATE.format(**row) for row in table.to_pylist()]
    lines, fingerprints = render_many(renderer_for(spec), rows.column("custom_id").to_pylist(), texts)
    written = b"".join(Path(d["requests_path"]).read_bytes() for d in descriptors)
    assert written == b"".join(line + b"\n" for line in lines)
    assert rows.column("request_fingerprint").to_pylist() == fingerprints


def test_a_failed_chunk_file_fails_the_job_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk files are written by a background thread; its error must reach the caller."""
    real = writer._write_chunk_files
    calls: list[Any] = []

    def fail_on_the_second(*args: Any) -> str:
        calls.append(args)
        if len(calls) == 2:
            raise OSError("disk full (test)")
        return real(*args)

    monkeypatch.setattr(writer, "_write_chunk_files", fail_on_the_second)
    job = tmp_path / "job"
    with pytest.raises(OSError, match="disk full"):
        write_chunks(save(products(100), tmp_path / "in.parquet"), job, OPENAI, TEMPLATE, chunk_size=10)
    assert leftovers(job) == []


@pytest.mark.parametrize(
    ("num_chunks", "num_rows", "fragments", "absent"),
    [
        pytest.param(1000, 10_000_000, [], [], id="at-the-limit"),
        pytest.param(
            1001,
            10_010_000,
            [
                "1,001 chunks of up to 10,000",
                "max_map_length = 1,000",
                "MAX_MAP_LENGTH to at least 1,001",
                "chunk_size to at least 10,010 (at most 50,000 for openai)",
            ],
            [],
            id="over-raise-either",
        ),
        pytest.param(
            2000, 100_000_000, ["MAX_MAP_LENGTH to at least 2,000"], ["chunk_size to at least"], id="over-config-only"
        ),
    ],
)
def test_check_map_length(
    monkeypatch: pytest.MonkeyPatch, num_chunks: int, num_rows: int, fragments: list[str], absent: list[str]
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "1000")
    if not fragments:
        check_map_length(num_chunks, num_rows=num_rows, chunk_size=10_000, provider="openai")
        return
    with pytest.raises(ChunkLimitError) as info:
        check_map_length(num_chunks, num_rows=num_rows, chunk_size=10_000, provider="openai")
    for fragment in fragments:
        assert fragment in str(info.value)
    for fragment in absent:
        assert fragment not in str(info.value)
