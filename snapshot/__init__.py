"""Consistent initial snapshots, tagged with the log position they match."""
