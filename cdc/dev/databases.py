"""The stack's databases: PostgreSQL (the main server and a version 17 one) and MariaDB."""

from __future__ import annotations

import glob
import os
import signal
import socket
from pathlib import Path
from typing import ClassVar

from cdc.dev.service import LOOPBACK, Service, _find_binary, _foreign, _same_path


class Postgres(Service):
    name = "postgres"
    run_as = "postgres"
    stop_signal = signal.SIGINT  # the postmaster's "fast shutdown"
    shared_buffers: ClassVar[str] = "256MB"

    @staticmethod
    def bindir() -> str:
        explicit = os.environ.get("CDC_PG_BINDIR")
        if explicit:
            return explicit
        installed = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                           key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0)
        if installed:
            return installed[-1]
        return os.path.dirname(_find_binary("postgres", []))

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def prepare(self) -> None:
        super().prepare()
        self.run([os.path.join(self.bindir(), "initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"])

    def command(self) -> list[str]:
        settings = {
            "listen_addresses": LOOPBACK, "port": self.port, "unix_socket_directories": str(self.dir),
            "wal_level": "logical", "max_replication_slots": 64, "max_wal_senders": 64,
            "max_connections": 300, "shared_buffers": self.shared_buffers,
            # A throwaway development server: durability against power loss buys nothing here.
            "fsync": "off", "full_page_writes": "off",
            "logging_collector": "off", "log_min_messages": "warning",
        }
        cmd = [os.path.join(self.bindir(), "postgres"), "-D", str(self.data)]
        for key, value in settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def probe(self) -> bool:
        import psycopg2

        try:
            conn = psycopg2.connect(host=LOOPBACK, port=self.port, user="postgres", dbname="postgres",
                                    connect_timeout=2)
        except psycopg2.OperationalError:
            return False
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW data_directory")
                row = cur.fetchone()
                assert row is not None  # SHOW returns exactly one row
                directory = row[0]
        except psycopg2.Error:
            return False
        finally:
            conn.close()
        return _same_path(directory, self.data) or _foreign(self, f"data directory {directory}")

    def settings(self) -> dict[str, str]:
        return {"PG_DSN": f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres",
                "PG_BINDIR": self.bindir()}


class Postgres17(Postgres):
    """A second PostgreSQL, version 17, for what 15 cannot do (failover slots): the binaries come
    from Maven Central (``cdc.dev.postgres17``), placed beside the service's directory (not in it:
    ``prepare`` hands the directory to the server's user, and the binaries are links into the
    cache)."""

    name = "postgres17"
    shared_buffers = "64MB"  # a few tests' worth of rows: leave the memory to the main server

    def bindir(self) -> str:  # type: ignore[override]  # the base's is static; this one is per data directory
        return str(self.dir.parent / "postgres17-install" / "bin")

    def prepare(self) -> None:
        from cdc.dev import postgres17

        postgres17.place(self.dir.parent / "postgres17-install")
        super().prepare()

    def settings(self) -> dict[str, str]:
        return {"PG17_DSN": f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres",
                "PG17_BINDIR": self.bindir()}


def _mysql_greeting_connection_id(sock: socket.socket) -> int:
    """The connection id in a MySQL/MariaDB server's initial handshake (protocol version 10):
    https://dev.mysql.com/doc/dev/mysql-server/latest/page_protocol_connection_phase_packets_protocol_handshake_v10.html
    """
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:3], "little"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ValueError("the server closed the connection before its greeting")
        data += chunk
    payload = data[4:]
    if payload[0] != 10:
        raise ValueError(f"not a protocol-10 greeting (first byte {payload[0]})")
    end = payload.index(b"\0", 1)  # after the NUL-terminated server version
    return int.from_bytes(payload[end + 1:end + 5], "little")


class MariaDB(Service):
    name = "mysql"
    run_as = "mysql"

    @property
    def socket_path(self) -> str:
        return str(self.dir / "mysqld.sock")

    def prepare(self) -> None:
        super().prepare()
        installer = _find_binary("mariadb-install-db", ["/usr/bin", "/usr/local/bin"])
        self.run([installer, "--no-defaults", f"--datadir={self.dir / 'data'}",
                  "--auth-root-authentication-method=normal", "--skip-test-db",
                  "--skip-name-resolve"])

    def command(self) -> list[str]:
        return [
            _find_binary("mariadbd", ["/usr/sbin", "/usr/local/sbin"]), "--no-defaults",
            f"--datadir={self.dir / 'data'}", f"--socket={self.socket_path}",
            f"--pid-file={self.dir / 'mariadbd.pid'}", f"--port={self.port}",
            f"--bind-address={LOOPBACK}", "--skip-name-resolve",
            f"--log-bin={self.dir / 'data' / 'binlog'}", "--server-id=1",
            "--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
            "--gtid-strict-mode=ON", "--log-slave-updates=ON",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
            "--default-time-zone=+00:00", "--max-connections=300",
            "--innodb-buffer-pool-size=256M", "--innodb-flush-log-at-trx-commit=2",
            "--sync-binlog=0", "--max-allowed-packet=256M", "--log-error=" + str(self.log_path),
        ]

    def _connect(self):
        import pymysql

        return pymysql.connect(unix_socket=self.socket_path, user="root", connect_timeout=2)

    def probe(self) -> bool:
        """Our server answers on its socket, and the TCP port is that server too.

        The socket lives in our data directory, so it can only be ours. The TCP port is proved
        ours by its greeting: the server greets every connection with its connection id, before
        any login; our server (over the socket) must list a connection of that id.
        """
        import pymysql

        try:
            conn = self._connect()
        except pymysql.err.OperationalError:
            return False
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=2) as tcp:
                connection_id = _mysql_greeting_connection_id(tcp)
                with conn.cursor() as cur:
                    cur.execute("SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                                (connection_id,))
                    ours = cur.fetchone()[0] == 1
        except (OSError, ValueError, pymysql.err.Error):
            return False
        finally:
            conn.close()
        return ours or _foreign(self, f"connection id {connection_id} is not one of our server's")

    def after_ready(self) -> None:
        # With --skip-name-resolve a TCP client from loopback is 'root'@'127.0.0.1', not localhost.
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
                cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        finally:
            conn.close()

    def settings(self) -> dict[str, str]:
        return {"MYSQL_URL": f"mysql://root@{LOOPBACK}:{self.port}"}
