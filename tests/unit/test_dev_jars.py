from cdc.dev.jars import _artifact


def test_artifact_name_drops_the_version():
    assert _artifact("delta-spark_2.13-4.0.0.jar") == "delta-spark_2.13"
    assert _artifact("spark-sql-kafka-0-10_2.13-4.0.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert _artifact("kafka-clients-3.9.0.jar") == "kafka-clients"
    assert _artifact("hadoop-client-api-3.4.1.jar") == "hadoop-client-api"
    assert _artifact("jsr305-3.0.0.jar") == "jsr305"
