"""Run the batch emulator from the command line.

Emulator
--------
A local, offline stand-in for the OpenAI Batch API and the Anthropic Message Batches API. The
real ``openai`` and ``anthropic`` SDKs talk to it unchanged over HTTP; answers are synthetic
and deterministic (a hash of model + messages), so runs are reproducible. No Airflow import.

Start it::

    python -m airflow_batch_emulator --port 0 --port-file /tmp/emu.port --latency 0.2

then point the SDKs at it: ``openai.OpenAI(api_key="x", base_url="http://127.0.0.1:PORT/v1")``
and ``anthropic.Anthropic(api_key="x", base_url="http://127.0.0.1:PORT")``. Any non-empty
``Authorization: Bearer`` or ``x-api-key`` is accepted. ``--port 0`` picks a free port;
``--port-file`` receives it (written atomically) once the server listens. One line per batch
state change goes to stderr (``--quiet`` silences them); SIGTERM/SIGINT stop it cleanly.
``--realtime-delay SECONDS`` is slept inside every realtime request so concurrency shows in
the stats (``realtime.realtime_max_concurrency``). ``--realtime-slots N`` serves at most N realtime
requests at once and ``--scheduling-policy priority|fcfs`` says who waits (``emulator/scheduling.py``).

OpenAI batches go validating → in_progress → finalizing → completed, one ``--latency`` apart
(about 3 x latency plus processing; 50,000 lines take a couple of seconds). Anthropic batches go
in_progress → ended after about one latency. Realtime routes (``POST /v1/chat/completions``,
``/v1/embeddings``, ``/v1/messages``…) answer directly.

Amazon Bedrock: ``boto3.client("bedrock", endpoint_url="http://127.0.0.1:PORT")`` (any SigV4
credentials) creates, gets, lists and stops model invocation jobs (Submitted → Validating →
Scheduled → InProgress → Completed, one latency apart); ``bedrock-runtime`` ``invoke_model``
answers at once. Job data lives in S3: ``--s3-endpoint-url`` (moto's server, or any S3), or by
default a moto server the emulator starts on the same host. See :mod:`.bedrock_api`.

Google Gemini (Developer API): ``genai.Client(api_key="x", http_options={"base_url":
"http://127.0.0.1:PORT", "api_version": "v1beta"})`` uploads files (resumable), creates batches
(``models/{model}:batchGenerateContent``), gets, lists and cancels them (PENDING → RUNNING →
SUCCEEDED, one latency apart) and downloads their result files; ``generateContent`` answers at
once. The key goes in ``x-goog-api-key``. Line faults as below (an expired line ends its whole
job ``EXPIRED``). See :mod:`.gemini_api`.

Control routes (no auth, never faulted): ``GET /_emulator/stats`` (counters; ``routes`` counts API calls per
route, e.g. ``"GET /v1/batches/{batch_id}"``),
``POST /_emulator/reset`` (forget everything; faults back to the start-up switches),
``POST /_emulator/hurry`` (running OpenAI and Anthropic batches drop their ``slow``: a held job ends now),
``GET|POST /_emulator/faults`` (read / replace the fault settings with a JSON object of the
fields below), ``GET /_emulator/batches[?custom_ids=1]`` (``{"data": [...]}``: every batch of both providers
with provider, id, status, ``custom_id_count``, ``polls`` and ``held``), ``GET /_emulator/health``.

In tests, the pytest plugin gives ``batch_emulator`` (reset before each test; ``.url``,
``.openai_base_url``, ``.anthropic_base_url``, ``.stats()``, ``.set_faults(**kw)``, ``.reset()``,
``.batches()``) and ``batch_emulator_env`` (also sets ``AIRFLOW_CONN_OPENAI_BATCH_DEFAULT`` and
``AIRFLOW_CONN_ANTHROPIC_BATCH_DEFAULT``).

Faults (all deterministic for a given ``--seed``, default 0):

=========================  ======================================================================
switch                     what the emulator does
=========================  ======================================================================
--line-error-rate R        fraction R of lines fail retryably: OpenAI error-file line with
                           ``status_code`` 500 / ``server_error``; Anthropic ``errored``/api_error
--invalid-line-rate R      fraction R of lines fail for good: 400 ``invalid_request_error``
--expire-rate R            fraction R of lines expire: OpenAI ``batch_expired`` error-file lines
                           and the batch ends ``expired`` (finished lines stay in the output
                           file); Anthropic ``expired`` results
--truncate-rate R          fraction R of answers are cut off as at max_tokens, the same ones every
                           run: text or JSON ends early; OpenAI ``finish_reason: "length"``,
                           Anthropic ``stop_reason: "max_tokens"``
--cache-miss-rate R        fraction R of Anthropic batch requests miss the prompt cache although
                           their ``cache_control`` prefix is cached (hits are best-effort)
--fail-validation [CODE]   every new OpenAI batch fails validation with CODE
                           (default ``invalid_json_line``)
--cancel-batches           provider-side cancel of every new batch once half its lines are done
--http-429-rate R          fraction R of API calls get 429 with ``retry-after`` /
                           ``retry-after-ms`` (``--retry-after SECONDS``, default 1)
--realtime-max-in-flight N realtime routes admit N requests at once (a server at its
                           ``--max-num-seqs``); one more gets 429 with ``retry-after``
--http-500-rate R          fraction R of API calls get a 500
--drop-rate R              fraction R of API calls have the connection closed without an answer
--slow SECONDS             each batch spends this much longer in progress (lines are paced
                           over it, so counts grow gradually and a cancel lands mid-way)
--token-limit N            OpenAI: a batch whose estimated input tokens plus those of in-flight
                           batches of the same model exceed N fails ``token_limit_exceeded``
--polls-before-done N      a finished batch stays in progress (OpenAI ``finalizing``, or
                           ``in_progress`` if it expires; Anthropic ``in_progress``) until its
                           status was retrieved N times (``GET /v1/batches/{id}``,
                           ``GET /v1/messages/batches/{id}``; listing does not count): the N-th
                           retrieve is the first that can see it ended, as with a real batch that
                           outlasts a poll interval. Failed validation and cancels are not held
--delay-route 'M /p=S'     hold every ``M /p`` call S seconds *before* the route runs (repeatable;
                           ``{name}`` matches one path segment: ``'GET /v1/files/{id}/content=30'``);
                           a client that hangs up meanwhile gets nothing done
--delay-after-route 'M /p=S'  run the route, then hold the answer S seconds (the object exists,
                           the client does not know its id yet); a hang-up drops the answer
=========================  ======================================================================

Route delays are how the crash tests stop a task at a known point and kill it there; held
requests show in ``GET /_emulator/stats`` under ``http.delayed_in_flight`` (counts per route) and
``http.delayed_calls`` (one entry per held call: ``id``, ``phase``, ``request``, the caller's
``client`` ``host:port``, ``held_s``). ``POST /_emulator/release`` with ``{"ids": [...]}`` (or no
body: every held call) ends those holds now, as if their delay had run out: a test holds a route
for long and releases the calls one by one, in the order it needs (``http.delayed_released``
counts them).

Line faults are picked per (seed, custom_id); HTTP faults per call from a seeded counter, so a
retried request rolls again and the SDK's retries can get through. The expiry check wins over
the error checks. OpenAI ``request_counts.failed`` counts error lines only, so
``total - completed - failed`` is the number of expired (or never-run) lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from airflow_batch_emulator.config import EmulatorConfig
from airflow_batch_emulator.faults import DEFAULT_VALIDATION_CODE, Faults
from airflow_batch_emulator.server import BatchEmulator


def _add_scheduling_args(parser: argparse.ArgumentParser) -> None:
    """Add the realtime scheduler's switches (emulator/scheduling.py)."""
    parser.add_argument(
        "--realtime-slots", type=int, default=0, help="realtime requests served at once; 0 = unlimited (default)"
    )
    parser.add_argument(
        "--scheduling-policy",
        choices=("priority", "fcfs"),
        default="priority",
        help="how waiting realtime requests get a slot: by request 'priority' (lower first), or arrival",
    )


def build_parser() -> argparse.ArgumentParser:
    """Return the CLI argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_batch_emulator",
        description="Local emulator of the OpenAI Batch, Anthropic Message Batches and Amazon Bedrock batch APIs.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8089, help="port to bind; 0 picks a free one (default 8089)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds between batch states (default 0.2)")
    parser.add_argument("--realtime-delay", type=float, default=0.0, help="seconds slept per realtime request")
    _add_scheduling_args(parser)
    _add_fault_args(parser)
    parser.add_argument("--s3-endpoint-url", default=None, help="S3 endpoint of Bedrock job data (default: moto)")
    parser.add_argument("--bedrock-min-records", type=int, default=100, help="Bedrock records-per-job minimum")
    parser.add_argument("--quiet", action="store_true", help="do not log batch state changes")
    return parser


def _add_fault_args(parser: argparse.ArgumentParser) -> None:
    """Add the fault switches: which lines fail, which calls are refused, slowed or held."""
    parser.add_argument("--seed", type=int, default=0, help="seed of every fault decision (default 0)")
    parser.add_argument("--line-error-rate", type=float, default=0.0, help="fraction of lines failing with 500")
    parser.add_argument("--invalid-line-rate", type=float, default=0.0, help="fraction of lines failing with 400")
    parser.add_argument("--expire-rate", type=float, default=0.0, help="fraction of lines that expire")
    parser.add_argument(
        "--truncate-rate", type=float, default=0.0, help="fraction of answers cut off at max_tokens (same ones)"
    )
    parser.add_argument(
        "--fail-validation",
        nargs="?",
        const=DEFAULT_VALIDATION_CODE,
        default=None,
        metavar="CODE",
        help=f"fail every new OpenAI batch's validation with CODE (default {DEFAULT_VALIDATION_CODE})",
    )
    parser.add_argument("--cancel-batches", action="store_true", help="cancel every new batch provider-side")
    parser.add_argument("--http-429-rate", type=float, default=0.0, help="fraction of API calls answered 429")
    parser.add_argument(
        "--realtime-max-in-flight", type=int, default=0, help="realtime requests admitted at once; more get 429"
    )
    parser.add_argument("--retry-after", type=float, default=1.0, help="retry-after seconds on 429s (default 1)")
    parser.add_argument("--http-500-rate", type=float, default=0.0, help="fraction of API calls answered 500")
    parser.add_argument("--drop-rate", type=float, default=0.0, help="fraction of API calls dropped unanswered")
    parser.add_argument(
        "--cache-miss-rate",
        type=float,
        default=0.0,
        help="fraction of batch requests whose cache_control prefix misses (and is written) anyway (default 0)",
    )
    parser.add_argument("--slow", type=float, default=0.0, help="extra seconds each batch spends in progress")
    parser.add_argument("--token-limit", type=int, default=None, help="OpenAI enqueued-token limit per model")
    parser.add_argument(
        "--polls-before-done",
        type=int,
        default=0,
        metavar="N",
        help="hold each finished batch in progress until its status was retrieved N times (default 0: off)",
    )
    parser.add_argument(
        "--delay-route",
        action="append",
        default=[],
        metavar="'METHOD /path=SECONDS'",
        help="hold matching calls SECONDS before the route runs (repeatable); held calls are listed in "
        'GET /_emulator/stats (http.delayed_calls) and POST /_emulator/release {"ids": [...]} ends a hold early',
    )
    parser.add_argument(
        "--delay-after-route",
        action="append",
        default=[],
        metavar="'METHOD /path=SECONDS'",
        help="run matching calls, then hold the answer SECONDS (repeatable)",
    )
    parser.add_argument("--lose-answer-rate", type=float, default=0.0,
                        help="fraction of creates and uploads that take effect but lose their answer")  # fmt: skip
    parser.add_argument("--lose-answer-route", action="append", default=[], metavar="'METHOD /path=N'",
                        help="the next N matching calls take effect but lose their answer (repeatable)")  # fmt: skip
    parser.add_argument("--lose-answer-as", choices=("500", "drop"), default="500",
                        help="a lost answer is a 500 (default) or a dropped connection")  # fmt: skip
    parser.add_argument("--process-after-hangup", action="store_true",
                        help="a call held by --delay-route still runs after its client hung up")  # fmt: skip


def parse_route_delays(values: list[str], flag: str) -> dict[str, float]:
    """Turn ``['POST /v1/batches=20', ...]`` into ``{'POST /v1/batches': 20.0}``; reject malformed items."""
    delays: dict[str, float] = {}
    for item in values:
        key, sep, seconds = item.rpartition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} {item!r}: expected 'METHOD /path=SECONDS', e.g. 'POST /v1/batches=20'.")
        try:
            delays[key.strip()] = float(seconds)
        except ValueError:
            raise ValueError(f"{flag} {item!r}: {seconds!r} is not a number of seconds.") from None
    return delays


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """Turn parsed arguments into an ``EmulatorConfig``."""
    faults = Faults(
        seed=args.seed,
        line_error_rate=args.line_error_rate,
        invalid_line_rate=args.invalid_line_rate,
        expire_rate=args.expire_rate,
        truncate_rate=args.truncate_rate,
        realtime_max_in_flight=args.realtime_max_in_flight,
        fail_validation=args.fail_validation,
        cancel_batches=args.cancel_batches,
        http_429_rate=args.http_429_rate,
        retry_after=args.retry_after,
        http_500_rate=args.http_500_rate,
        drop_rate=args.drop_rate,
        slow=args.slow,
        token_limit=args.token_limit,
        polls_before_done=args.polls_before_done,
        delay_routes=parse_route_delays(args.delay_route, "--delay-route"),
        delay_after_routes=parse_route_delays(args.delay_after_route, "--delay-after-route"),
        lose_answer_rate=args.lose_answer_rate,
        lose_answer_routes={
            k: int(v) for k, v in parse_route_delays(args.lose_answer_route, "--lose-answer-route").items()
        },
        lose_answer_as=args.lose_answer_as,
        process_after_hangup=args.process_after_hangup,
        cache_miss_rate=args.cache_miss_rate,
    )
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        latency=args.latency,
        realtime_delay=args.realtime_delay,
        faults=faults,
        s3_endpoint_url=args.s3_endpoint_url,
        bedrock_min_records=args.bedrock_min_records,
        realtime_slots=args.realtime_slots,
        scheduling_policy=args.scheduling_policy,
    )


def write_port_file(path: Path, port: int) -> None:
    """Write ``port`` to ``path`` atomically (temp file, then rename), so readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the emulator until SIGTERM/SIGINT."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s emulator %(message)s",
        stream=sys.stderr,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    emulator = BatchEmulator(config).start()
    try:
        if args.port_file is not None:
            write_port_file(args.port_file, emulator.port)
        while not stop.wait(0.5):
            pass
    finally:
        emulator.stop()
        logging.getLogger("airflow_batch_emulator").info("batch emulator stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
