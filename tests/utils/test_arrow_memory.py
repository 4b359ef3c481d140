"""Inside ``returning_memory`` Arrow allocates from jemalloc (where pyarrow has it); the default comes back after."""

from __future__ import annotations

import pyarrow as pa

from airflow_batch_provider.utils.arrow_memory import returning_memory


def test_jemalloc_inside_and_the_previous_pool_after() -> None:
    before = pa.default_memory_pool().backend_name
    with returning_memory():
        inside = pa.default_memory_pool().backend_name
        kept = pa.array(["a buffer allocated inside"] * 1000)
    assert pa.default_memory_pool().backend_name == before
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow build without jemalloc keeps its allocator
        assert inside == before
    else:
        assert inside == "jemalloc"
    assert kept.to_pylist()[-1] == "a buffer allocated inside"  # buffers outlive the block
