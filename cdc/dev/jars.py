"""Resolve the Java parts of the stack from Maven Central into the cache, once.

Each component has a small POM under ``maven/``; ``mvn dependency:copy-dependencies`` copies its
runtime closure into ``<cache>/jars/<component>``. A stamp holding the POM's digest makes a second
call free, and a changed POM re-resolves. Maven runs with ``maven/settings.xml``, which sends every
repository a POM declares to Maven Central (Spark's parent POM names a mirror not every machine
reaches); ``$CDC_MAVEN_SETTINGS`` points at other settings where a site has its own mirror.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from cdc.dev.paths import cache_dir
from cdc.errors import DevStackError

COMPONENTS = ("kafka", "opensearch", "opensearch-security", "spark", "spark-avro", "spark-iceberg", "iceberg-rest",
              "connect", "registry", "postgres17")
# connect: Kafka Connect + the Debezium JDBC sink (tests). registry: Apicurio Registry, which is not
# a set of jars to copy but an app to build (``mvn package`` with the sources in maven/registry/).
# postgres17: PostgreSQL 17 server binaries in one jar, unpacked by cdc.dev.postgres17.
# opensearch-security: the security plugin's zip, for the opensearch-secure node.
# spark-avro: Spark's from_avro, with which the delta sink reads the avro format.
# spark-iceberg: Iceberg's Spark runtime and PostgreSQL's JDBC driver (table_format: iceberg).
# iceberg-rest: Iceberg's REST catalog server (its test fixture), for the tests of the rest catalog.
BUILT = {"registry"}
# The components a service of the stack needs, where more than (or not the same as) its name.
SERVICE_COMPONENTS = {"opensearch-secure": ("opensearch", "opensearch-security")}
# The jars of a Spark session of the delta sink: the Kafka source, Delta Lake, spark-avro, Iceberg.
SPARK_COMPONENTS = ("spark", "spark-avro", "spark-iceberg")


def components_of(service: str) -> tuple[str, ...]:
    return SERVICE_COMPONENTS.get(service, (service,) if service in COMPONENTS else ())


def _maven_file(name: str) -> Path:
    return Path(str(resources.files("cdc.dev") / "maven" / name))


def jar_dir(component: str) -> Path:
    return cache_dir() / "jars" / component


def ensure_jars(component: str) -> Path:
    """Return the directory holding ``component``'s jars, resolving them first if needed."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown jar component {component!r}; known: {', '.join(COMPONENTS)}")
    pom = _maven_file(f"{component}.xml")
    sources = sorted(_maven_file(component).glob("*")) if component in BUILT else []
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in (pom, *sources))).hexdigest()
    target = jar_dir(component)
    stamp = target / ".stamp"
    if stamp.is_file() and stamp.read_text() == digest:
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevStackError("Maven (mvn) is not installed; run scripts/setup (apt-get install maven)")
    settings = os.environ.get("CDC_MAVEN_SETTINGS") or str(_maven_file("settings.xml"))
    staging = target.with_name(component + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    if component in BUILT:
        _build_app(mvn, settings, component, pom, sources, staging)
    else:
        cmd = [mvn, "-q", "-B", "-s", settings, "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
        _run_maven(cmd, component)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    stamp.write_text(digest)
    return target


def _run_maven(cmd: list[str], component: str, cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise DevStackError(f"resolving the {component} jars from Maven Central failed:\n{tail}")


def _build_app(mvn: str, settings: str, component: str, pom: Path, sources: list[Path], staging: Path) -> None:
    """Build a Quarkus app from its POM and sources in a scratch project; leave the runnable jar
    (``app.jar``) and its ``lib/`` in ``staging``. Java sources go to src/main/java, the rest
    (``application.properties``) to src/main/resources."""
    project = staging.with_name(component + ".build")
    shutil.rmtree(project, ignore_errors=True)
    (project / "src/main/java").mkdir(parents=True)
    (project / "src/main/resources").mkdir(parents=True)
    shutil.copy(pom, project / "pom.xml")
    for source in sources:
        where = "java" if source.suffix == ".java" else "resources"
        shutil.copy(source, project / "src/main" / where / source.name)
    _run_maven([mvn, "-q", "-B", "-s", settings, "package", "-DskipTests"], component, cwd=project)
    built = project / "target"
    staging.mkdir(parents=True)
    runner = next(built.glob("*-runner.jar"))
    shutil.move(str(runner), staging / "app.jar")
    shutil.move(str(built / "lib"), staging / "lib")
    shutil.rmtree(project, ignore_errors=True)


def classpath(component: str) -> str:
    return str(ensure_jars(component) / "*")


def _artifact(jar_name: str) -> str:
    """``delta-spark_2.13-4.0.0.jar`` -> ``delta-spark_2.13``: the name without its version."""
    stem = jar_name.removesuffix(".jar")
    match = re.match(r"^(.*?)-\d+\.\d", stem)  # the version begins "N.N"; "-0-10" is part of a name
    return match.group(1) if match else stem


def spark_jars() -> list[str]:
    """The Kafka source, Delta, spark-avro and Iceberg jars that pyspark's own ``jars/`` does not already ship.

    Passing a second copy of a jar Spark has (Scala, Hadoop, slf4j) would put two versions of the
    same classes on one classpath, so those are left out.
    """
    import pyspark  # the [spark] extra

    bundled = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    found = [p for component in SPARK_COMPONENTS for p in ensure_jars(component).glob("*.jar")]
    return sorted({str(p) for p in found if _artifact(p.name) not in bundled})


if __name__ == "__main__":  # ``spark-submit --jars "$(python -m cdc.dev.jars)"``
    print(",".join(spark_jars()))
