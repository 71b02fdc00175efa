from spark_sinks.session import driver_address


def test_a_local_driver_binds_to_loopback_unless_spark_local_ip_says_otherwise():
    assert driver_address("local[2]", env={}) == {"spark.driver.bindAddress": "127.0.0.1",
                                                  "spark.driver.host": "127.0.0.1"}
    assert driver_address("local[2]", env={"SPARK_LOCAL_IP": "10.0.0.5"}) == {}
    assert driver_address("spark://cluster:7077", env={}) == {}  # executors elsewhere must reach it
