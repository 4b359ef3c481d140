"""``python -m airflow_batch_provider.cost``: batch vs real-time cost, time and a recommendation.

Example::

    python -m airflow_batch_provider.cost --rows 50000 --prompt-tokens 120 --output-tokens 5 --model gpt-4o-mini
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from airflow_batch_provider.cost.advisor import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TOKENS_PER_MINUTE,
    format_plan,
    plan_workload,
)
from airflow_batch_provider.exceptions import InvalidInputError


def build_parser() -> argparse.ArgumentParser:
    """Return the CLI's argument parser."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_batch_provider.cost",
        description="Compare batch and real-time cost and completion time of an LLM workload.",
    )
    parser.add_argument("--rows", type=int, required=True, help="requests per run")
    parser.add_argument("--prompt-tokens", type=int, required=True, help="average input tokens per request")
    parser.add_argument("--output-tokens", type=int, required=True, help="average output tokens per request")
    parser.add_argument("--model", required=True, help="model name, e.g. gpt-4o-mini or claude-haiku-4-5")
    parser.add_argument(
        "--tpm",
        type=int,
        default=DEFAULT_TOKENS_PER_MINUTE,
        help=f"your real-time tokens-per-minute limit for the model (default {DEFAULT_TOKENS_PER_MINUTE:,})",
    )
    parser.add_argument("--rpm", type=int, default=None, help="your real-time requests-per-minute limit")
    parser.add_argument("--runs-per-day", type=int, default=1, help="how often the workload runs per day")
    parser.add_argument(
        "--latency-sensitive",
        action="store_true",
        help="someone waits on each answer (chat, search, agent tools)",
    )
    parser.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="requests per batch file")
    parser.add_argument(
        "--pricing-file", default=None, help="JSON/YAML price overrides (on top of Airflow's [llm_batch] pricing_file)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        plan = plan_workload(
            args.rows,
            args.prompt_tokens,
            args.output_tokens,
            args.model,
            tokens_per_minute=args.tpm,
            requests_per_minute=args.rpm,
            runs_per_day=args.runs_per_day,
            latency_sensitive=args.latency_sensitive,
            chunk_size=args.chunk_size,
            pricing=args.pricing_file,
        )
    except InvalidInputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_plan(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
