"""``make bench``: the project's chunk and merge paths against plain reference loops, plus Airflow overhead.

Run ``python -m benchmarks.run --help`` (or ``make bench``); the method is described in
``docs/performance.md``. Inputs are cached under ``.demo/bench/`` (git-ignored), results are
written to ``benchmarks/results/`` (git-ignored).
"""
