"""The PostgreSQL source: pgoutput logical replication, consistent parallel snapshots."""
