from cdc.dev.jars import _artifact


def test_artifact_name_drops_the_version():
    assert _artifact("delta-spark_2.13-4.0.0.jar") == "delta-spark_2.13"
    assert _artifact("spark-sql-kafka-0-10_2.13-4.0.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert _artifact("kafka-clients-3.9.0.jar") == "kafka-clients"
    assert _artifact("hadoop-client-api-3.4.1.jar") == "hadoop-client-api"
    assert _artifact("jsr305-3.0.0.jar") == "jsr305"


def test_dev_up_takes_services_with_spaces_or_commas(capsys):
    import pytest

    from cdc.cli import build_parser
    from cdc.dev.cli import _services

    args = build_parser().parse_args(["dev", "up", "--only", "postgres,kafka", "redis"])
    assert [name for names in args.only for name in names] == ["postgres", "kafka", "redis"]
    assert _services("mysql,") == ["mysql"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dev", "up", "--only", "postgres,kafak"])
    assert "kafak" in capsys.readouterr().err
