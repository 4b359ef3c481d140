"""``python -m airflow_batch_provider.jobs gc --older-than 7d``: remove job folders retention no longer needs.

``python -m airflow_batch_provider.jobs reconcile --since 24h``: cancel duplicate batches that
landed after their runs (see :mod:`airflow_batch_provider.jobs.reconcile`).

Merged job folders (``merged.json``) go once their merge is older than ``--older-than``; unmerged
ones are treated as running and kept, unless ``--include-unmerged`` and nothing in them changed
for that long. ``--dry-run`` prints the decisions without removing anything. The root defaults to
the ChunkOperator's default work folder (``[llm_batch] work_dir``, default
``$AIRFLOW_HOME/batch_jobs``). See docs/retention.md.
"""

from __future__ import annotations

import argparse
import sys

from airflow_batch_provider.exceptions import InvalidInputError
from airflow_batch_provider.jobs.retention import collect, parse_age


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit code (2 for bad arguments)."""
    from airflow_batch_provider import settings

    parser = argparse.ArgumentParser(prog="python -m airflow_batch_provider.jobs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    gc = commands.add_parser("gc", help="remove old job folders")
    gc.add_argument("--root", default=None, help="the job folders' root (default: the ChunkOperator's work folder)")
    gc.add_argument("--older-than", required=True, help="age such as 7d, 12h, 30m (merged: since the merge)")
    gc.add_argument("--include-unmerged", action="store_true", help="also remove unmerged folders unchanged that long")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    rec = commands.add_parser("reconcile", help="cancel late duplicate batches (a key already served)")
    rec.add_argument("--since", required=True, help="how far back to list batches, e.g. 24h, 2d")
    rec.add_argument(
        "--provider",
        action="append",
        default=None,
        help="backend to check (repeatable; default: every provider and connection the checkpoints name)",
    )
    rec.add_argument("--conn-id", action="append", default=[],
                     help="PROVIDER=CONN_ID: a connection to check (repeatable; default: each provider's default "
                          "connection). Checkpoints naming any other connection are skipped and reported")  # fmt: skip
    rec.add_argument("--database", default=None, help="SQLAlchemy URL of the metadata DB (default: Airflow's)")
    rec.add_argument("--dry-run", action="store_true", help="report duplicates; cancel nothing")
    args = parser.parse_args(argv)
    if args.command == "reconcile":
        return _reconcile(args)
    try:
        decisions = collect(
            args.root or settings.work_dir(),
            parse_age(args.older_than),
            include_unmerged=args.include_unmerged,
            dry_run=args.dry_run,
        )
    except InvalidInputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    freed = 0
    for decision in decisions:
        action = verb if decision.remove else "kept"
        print(f"{action:>12}  {decision.job.path}  ({decision.reason}; {decision.job.size / 1e6:.1f} MB)")
        freed += decision.job.size if decision.remove else 0
    print(f"{len(decisions)} job folder(s); {verb} {sum(d.remove for d in decisions)}, {freed / 1e6:.1f} MB")
    return 0


def _reconcile(args: argparse.Namespace) -> int:
    from airflow_batch_provider.jobs.reconcile import run

    try:
        since = parse_age(args.since)
        conn_ids: dict[str, list[str]] = {}
        for item in args.conn_id:
            provider, _, conn_id = item.partition("=")
            if not provider or not conn_id:
                raise InvalidInputError(f"--conn-id {item!r}: write PROVIDER=CONN_ID, e.g. openai=openai_prod.")
            conn_ids.setdefault(provider, []).append(conn_id)
        found = run(args.provider, since_seconds=since, conn_ids=conn_ids, database=args.database,
                    dry_run=args.dry_run)  # fmt: skip
    except InvalidInputError as error:  # a bad argument, or an unknown --provider
        print(f"error: {error}", file=sys.stderr)
        return 2
    for duplicate in found:
        print(duplicate.line())
    cancelled = sum(d.cancelled for d in found)
    print(f"{len(found)} late duplicate batch(es) found in the last {args.since}; {cancelled} cancelled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
