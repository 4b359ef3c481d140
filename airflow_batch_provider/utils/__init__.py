"""Helpers with no knowledge of batches: paths and crash-safe writes, call retries, read-ahead threads."""
