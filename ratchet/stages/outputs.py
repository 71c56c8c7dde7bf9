"""The stages' atomic writes (defined in ratchet/atomic.py, which ratchet/rl/ uses too)."""

from ratchet.atomic import write_json, write_parquet, write_text

__all__ = ["write_json", "write_parquet", "write_text"]
