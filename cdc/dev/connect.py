"""A Kafka Connect standalone worker for the tests and benchmarks: Apache Kafka's own Connect
runtime with Debezium's connectors (the JDBC sink, the PostgreSQL and MariaDB sources), all from
Maven Central (``cdc.dev.jars``, component ``connect``).

One worker runs every connector given to it (one properties file each), in a session of its own
so that ``stop`` ends it whole. Its log goes to ``<dir>/connect.log``; ``log_tail`` shows the end
of it when a test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import BinaryIO

from cdc.dev.jars import ensure_jars

LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p [%t] %c: %m%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = org.apache.kafka
logger.kafka.level = warn
logger.connect.name = org.apache.kafka.connect.runtime.WorkerSinkTask
logger.connect.level = info
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _properties(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


class ConnectStandalone:
    def __init__(self, directory: Path, bootstrap: str) -> None:
        self.directory = directory
        self.bootstrap = bootstrap
        self.log = directory / "connect.log"
        self.process: subprocess.Popen | None = None
        self._output: BinaryIO | None = None

    def start(self, connectors: dict[str, dict[str, str]], worker_settings: dict[str, str] | None = None,
              heap: str = "512m") -> None:
        """Run ``connectors`` (name -> settings); ``worker_settings`` override or add worker
        properties (converters, ``producer.*``), ``heap`` is the JVM's -Xmx."""
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed; run scripts/setup")
        jars = ensure_jars("connect")
        worker = _properties(self.directory / "worker.properties", {
            "bootstrap.servers": self.bootstrap,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true",
            "offset.storage.file.filename": str(self.directory / "offsets"),
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{_free_port()}",
            "plugin.discovery": "only_scan",
            **(worker_settings or {}),
        })
        files = [str(_properties(self.directory / f"{name}.properties", {"name": name, **settings}))
                 for name, settings in connectors.items()]
        config = self.directory / "log4j2.properties"
        config.write_text(LOG4J2.format(log=self.log))
        self._output = open(self.directory / "connect.out", "wb")
        self.process = subprocess.Popen(
            [java, f"-Xmx{heap}", f"-Dlog4j2.configurationFile={config}", "-cp", f"{jars}/*",
             "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), *files],
            cwd=self.directory, stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def task_failed(self) -> bool:
        """A task died (the worker itself keeps running and would wait forever)."""
        return self.log.exists() and "Task threw an uncaught and unrecoverable exception" in self.log.read_text(
            errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        text = ""
        for path in (self.log, self.directory / "connect.out"):
            if path.exists():
                text += "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"
        return text

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._output is not None:
            self._output.close()
            self._output = None


def first_value(bootstrap: str, topic: str, worker: ConnectStandalone, timeout: float = 180) -> dict:
    """The first non-tombstone value of ``topic`` (Connect JSON, decoded), waiting while the
    worker runs; the worker's log is in the error when nothing comes."""
    import time
    import uuid

    import orjson
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and worker.alive():
            message = consumer.poll(1.0)
            if message is None or message.error() is not None:
                continue
            value = message.value()
            if value is not None:
                return orjson.loads(value)
    finally:
        consumer.close()
    raise AssertionError(f"no record on {topic} (worker alive: {worker.alive()}):\n{worker.log_tail()}")
