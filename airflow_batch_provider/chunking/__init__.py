"""Stage 1, table → chunk files: read the table, render each row's request, check it, write JSONL chunks."""
