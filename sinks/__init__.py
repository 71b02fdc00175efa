"""Sink plugins: consume compacted topics and keep a derived store in sync."""
