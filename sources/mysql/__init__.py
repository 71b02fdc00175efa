"""``type: mysql``: MariaDB/MySQL binlog capture after a consistent snapshot (see ``source``)."""
