"""The log's servers: one Kafka broker; a cluster of three (``kafka1``..``kafka3``, the ``cluster``
profile); the schema registry for the ``avro`` format."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.request
import uuid
from typing import ClassVar

from cdc.dev import jars
from cdc.dev.service import LOOPBACK, Service, _foreign, _java, port_open
from cdc.errors import DevStackError


class Kafka(Service):
    """One KRaft broker+controller.

    Besides its ``PLAINTEXT`` listener the broker has a ``FAULTS`` listener on ``fault_port`` that
    advertises ``fault_proxy_port``, a port where nothing listens until a test's fault proxy binds
    it and forwards to ``fault_port``. A client bootstrapped at the proxy is told the proxy's
    address in every metadata response, so all its connections (not just the first) pass the
    proxy, which can then cut, stall or slow them (``tests/faults``).
    """

    name = "kafka"
    port_names: ClassVar[tuple[str, ...]] = ("port", "controller_port", "fault_port", "fault_proxy_port")

    def _java_cmd(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        return [_java(), "-Xms256m", f"-Xmx{heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.dir / 'logs'}",
                "-cp", jars.classpath("kafka"), main, *args]

    def prepare(self) -> None:
        super().prepare()
        props = {
            "node.id": 1, "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.ports['controller_port']}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.ports['controller_port']},"
                         f"FAULTS://{LOOPBACK}:{self.ports['fault_port']}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},"
                                    f"FAULTS://{LOOPBACK}:{self.ports['fault_proxy_port']}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,FAULTS:PLAINTEXT",
        }
        self._write_config(props)
        cluster_id = _kafka_cluster_id()
        self.run(self._java_cmd("kafka.tools.StorageTool", "format", "--standalone",
                                "-t", cluster_id, "-c", str(self.dir / "server.properties")))

    def _write_config(self, props: dict, replicas: int = 1, insync: int = 1) -> None:
        """server.properties (what every node of ours shares, ``replicas`` and ``insync`` for every
        topic and Kafka's internal ones, then ``props``), and log4j2.properties: WARN and above, to
        the console (the log file)."""
        shared = {
            "process.roles": "broker,controller", "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT", "log.dirs": str(self.dir / "data"), "num.partitions": 1,
            **{name: replicas for name in ("default.replication.factor", "offsets.topic.replication.factor",
                                           "transaction.state.log.replication.factor",
                                           "share.coordinator.state.topic.replication.factor")},
            **{name: insync for name in ("min.insync.replicas", "transaction.state.log.min.isr",
                                         "share.coordinator.state.topic.min.isr")},
            "group.initial.rebalance.delay.ms": 0, "auto.create.topics.enable": "false",
            "log.cleaner.backoff.ms": 1000, "message.max.bytes": 16777216,
        }
        (self.dir / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in {**shared, **props}.items()))
        (self.dir / "log4j2.properties").write_text(
            "rootLogger.level = WARN\nrootLogger.appenderRef.out.ref = OUT\n"
            "appender.out.type = Console\nappender.out.name = OUT\n"
            "appender.out.layout.type = PatternLayout\n"
            "appender.out.layout.pattern = [%d] %p %m (%c)%n\n")

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


class KafkaNode(Kafka):
    """One of three KRaft nodes (broker and controller each, a static quorum of three) forming a
    replicated cluster: topics default to replication factor 3 and ``min.insync.replicas`` 2, as
    in production. Each node is a service of its own, so a test can kill, stop or start one
    (``cdc dev kill kafka2``). The three share one ports map (``group``): every node needs the
    others' controller ports in its quorum, and formats its storage with the same cluster id,
    derived from those ports. No fault listener: the fault proxy belongs to the single broker.
    """

    on_demand: ClassVar[bool] = True   # the ``cluster`` profile starts them
    group: ClassVar[str] = "kafka-cluster"
    node: ClassVar[int]
    nodes: ClassVar[int] = 3
    port_names: ClassVar[tuple[str, ...]] = tuple(f"{kind}{n}" for n in (1, 2, 3) for kind in ("port", "controller"))

    @property
    def port(self) -> int:
        return self.ports[f"port{self.node}"]

    def prepare(self) -> None:
        Service.prepare(self)
        voters = ",".join(f"{n}@{LOOPBACK}:{self.ports[f'controller{n}']}" for n in range(1, self.nodes + 1))
        self._write_config({
            "node.id": self.node, "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.ports[f'controller{self.node}']}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            # A node back from a crash or a restart takes its partitions' leadership back soon.
            "leader.imbalance.check.interval.seconds": 10,
        }, replicas=3, insync=2)
        self.run(self._java_cmd("kafka.tools.StorageTool", "format", "-t", self.shared_cluster_id(),
                                "-c", str(self.dir / "server.properties")))

    def shared_cluster_id(self) -> str:
        """The cluster id all three nodes format with: a digest of the group's ports."""
        digest = hashlib.sha256(json.dumps(self.ports, sort_keys=True).encode()).digest()[:16]
        return base64.urlsafe_b64encode(b"\x01" + digest[1:]).decode().rstrip("=")   # never starts with '-'

    def command(self) -> list[str]:
        return self._java_cmd("kafka.Kafka", str(self.dir / "server.properties"), heap="512m")

    def settings(self) -> dict[str, str]:
        servers = ",".join(f"{LOOPBACK}:{self.ports[f'port{n}']}" for n in range(1, self.nodes + 1))
        return {"KAFKA_CLUSTER_BOOTSTRAP": servers, f"KAFKA_CLUSTER_NODE{self.node}": f"{LOOPBACK}:{self.port}"}


class Kafka1(KafkaNode):
    name, node = "kafka1", 1


class Kafka2(KafkaNode):
    name, node = "kafka2", 2


class Kafka3(KafkaNode):
    name, node = "kafka3", 3


def _kafka_cluster_id() -> str:
    """A random cluster id in Kafka's form (22 URL-safe base64 characters).

    One in 64 such ids begins with ``-``, which ``kafka-storage format -t`` reads as an option and
    fails on; Kafka's own ``random-uuid`` draws again in that case, and so do we.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


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
