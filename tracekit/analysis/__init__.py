"""Analyses: pure functions over ingested polars tables (no file I/O here)."""
