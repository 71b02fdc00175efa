"""A Spark standalone cluster for the ``cluster`` profile: a master and two workers on loopback,
each a JVM of pyspark's own Spark (its ``jars/``), each a service of its own so that a test can
kill one (``cdc dev kill spark-worker1``: the worker and the executors it launched, one process
group) and start it again.

The three share one ports map (``group``): a worker needs the master's port, and the master's
web UI (``/json/``) is how a worker is seen registered. An application asks the cluster for
``spark.cores.max`` cores; the executor goes to a worker with one free, and when that worker dies
the master launches a new executor on the other one.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import ClassVar

from cdc.dev.service import LOOPBACK, Service, _foreign, _java
from cdc.errors import DevStackError

WORKER_CORES, WORKER_MEMORY = 1, "2g"  # per worker: one executor of 1 core at most


def _java_home() -> str:
    """The JDK spark-class runs (it takes JAVA_HOME, else the ``java`` on the PATH)."""
    return str(Path(_java()).resolve().parent.parent)


def spark_home() -> Path:
    """pyspark's directory, which holds Spark's jars and scripts (found without importing it)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise DevStackError("pyspark is not installed; run scripts/setup")
    return Path(spec.origin).parent


class SparkNode(Service):
    on_demand: ClassVar[bool] = True   # the ``cluster`` profile starts them
    group: ClassVar[str] = "spark-cluster"
    port_names: ClassVar[tuple[str, ...]] = ("master", "master_ui", "worker1_ui", "worker2_ui")
    main_class: ClassVar[str]

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.ports['master']}"

    def command(self) -> list[str]:
        # bin/spark-class sets what a worker's executor launcher needs (SPARK_SCALA_VERSION among it),
        # then execs the JVM: the service's pid is the JVM's.
        return [str(spark_home() / "bin" / "spark-class"), self.main_class, *self.arguments()]

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        # A worker launches its executors from SPARK_HOME, into SPARK_WORKER_DIR; both bind loopback.
        return {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": LOOPBACK, "SPARK_WORKER_DIR": str(self.dir / "work"),
                "SPARK_LOG_DIR": str(self.dir), "SPARK_DAEMON_MEMORY": "512m", "JAVA_HOME": _java_home()}

    def master_state(self) -> dict:
        """The master's ``/json/`` (its workers and applications); OSError or ValueError if unanswered."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.ports['master_ui']}/json/", timeout=3) as response:
            return json.load(response)

    def settings(self) -> dict[str, str]:
        return {"SPARK_CLUSTER_MASTER": self.master_url,
                "SPARK_CLUSTER_UI": f"http://{LOOPBACK}:{self.ports['master_ui']}"}


class SparkMaster(SparkNode):
    name = "spark-master"
    main_class = "org.apache.spark.deploy.master.Master"

    @property
    def port(self) -> int:
        return self.ports["master"]

    def arguments(self) -> list[str]:
        return ["--host", LOOPBACK, "--port", str(self.ports["master"]), "--webui-port", str(self.ports["master_ui"])]

    def probe(self) -> bool:
        try:
            state = self.master_state()
        except (OSError, ValueError):
            return False
        if state.get("url") != self.master_url:
            return _foreign(self, f"master {state.get('url')!r}")
        return state.get("status") == "ALIVE"


class SparkWorker(SparkNode):
    main_class = "org.apache.spark.deploy.worker.Worker"
    worker: ClassVar[int]

    @property
    def port(self) -> int:
        return self.ports[f"worker{self.worker}_ui"]

    def arguments(self) -> list[str]:
        return [self.master_url, "--host", LOOPBACK, "--webui-port", str(self.port), "--cores", str(WORKER_CORES),
                "--memory", WORKER_MEMORY]

    def probe(self) -> bool:
        """Registered with the master: it lists an alive worker with this one's web UI."""
        try:
            workers = self.master_state().get("workers", [])
        except (OSError, ValueError):
            return False
        ui = f"http://{LOOPBACK}:{self.port}"
        return any(w.get("state") == "ALIVE" and w.get("webuiaddress") == ui for w in workers)

    def settings(self) -> dict[str, str]:
        return {**super().settings(), f"SPARK_CLUSTER_WORKER{self.worker}_UI": f"http://{LOOPBACK}:{self.port}"}


class SparkWorker1(SparkWorker):
    name, worker = "spark-worker1", 1


class SparkWorker2(SparkWorker):
    name, worker = "spark-worker2", 2

