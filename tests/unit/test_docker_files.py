"""docker/ cannot be run here (no Docker engine); check what can be checked without one."""

from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_declares_the_stack_with_capture_settings():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "mysql", "kafka", "redis", "opensearch", "cdc"}
    assert "wal_level=logical" in services["postgres"]["command"]
    assert services["postgres"]["image"] == "postgres:17"
    mysql = services["mysql"]["command"]
    for flag in ("--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL",
                 "--gtid-mode=ON"):
        assert flag in mysql
    assert services["mysql"]["image"] == "mysql:8.4"
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    assert services["cdc"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert services["cdc"]["environment"]["OPENSEARCH_URL"] == "http://opensearch:9200"


def test_dockerfile_copies_every_import_package():
    text = (DOCKER / "Dockerfile").read_text()
    for package in ("cdc", "sources", "sinks", "snapshot", "spark_sinks"):
        assert f"COPY {package} ./{package}" in text
