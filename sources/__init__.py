"""Source plugins: decode a database's replication log into ordered change events."""
