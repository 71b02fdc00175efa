"""A Spark standalone cluster on loopback for a test: a master and workers, each a JVM of pyspark's
own Spark (``bin/spark-class``) in a session of its own, so that one can be killed with its
executors (tests.daemon.kill_daemon)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from cdc.dev.services import free_port

LOOPBACK = "127.0.0.1"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class SparkCluster:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.port, self.ui = free_port(), free_port()
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.env = {**os.environ, "SPARK_HOME": str(_spark_home()), "SPARK_LOCAL_IP": LOOPBACK,
                    "SPARK_LOG_DIR": str(work), "SPARK_WORKER_DIR": str(work / "work")}

    @property
    def url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        out = open(self.work / f"{name}.log", "ab")
        try:
            return subprocess.Popen([str(_spark_home() / "bin" / "spark-class"), *args], env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    def start(self, cores: int = 1) -> SparkCluster:
        self.work.mkdir(parents=True, exist_ok=True)
        self.master = self._start("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                                  "--port", str(self.port), "--webui-port", str(self.ui))
        self.add_worker(cores)
        return self

    def add_worker(self, cores: int = 1, memory: str = "3g") -> subprocess.Popen:
        """A worker; returns once the master lists it alive."""
        before = self.alive_workers()
        worker = self._start(f"worker{len(self.workers)}", "org.apache.spark.deploy.worker.Worker", self.url,
                             "--host", LOOPBACK, "--webui-port", str(free_port()), "--cores", str(cores),
                             "--memory", memory)
        self.workers.append(worker)
        deadline = time.monotonic() + 120
        while self.alive_workers() <= before:
            assert worker.poll() is None, (self.work / f"worker{len(self.workers) - 1}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the Spark worker did not register with the master"
            time.sleep(0.5)
        return worker

    def state(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ui}/json/", timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            return {}

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        from tests.daemon import kill_daemon

        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                kill_daemon(process)
