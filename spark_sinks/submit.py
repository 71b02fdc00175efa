"""Run a delta sink of a config file on a Spark cluster: ``spark-submit`` this file.

    python -m spark_sinks.submit CONFIG SINK          # locally (master from the sink's spark.master)

    spark-submit --master yarn --deploy-mode client \\
      --jars "$(python -c 'from cdc.api import spark_jars; print(",".join(spark_jars()))')" \\
      --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
      --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
      --conf spark.sql.codegen.cache.maxEntries=1000 \\
      "$(python -c 'import spark_sinks.submit as m; print(m.__file__)')" cdc.yaml lake

``--jars`` are the Kafka source and Delta jars (``spark-sql-kafka-0-10``, ``kafka-clients``,
``delta-spark``, ``delta-storage``, ``commons-pool2``) that ``cdc dev up`` resolved from Maven
Central; ``--packages io.delta:delta-spark_2.13:4.0.0,org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0``
does the same where the cluster reaches Maven. ``codegen.cache.maxEntries`` is what a local
session sets (``session.py``): a MERGE batch's generated classes outlast the default cache of 100. The driver needs this project installed
(``pip install 'cdc-framework[spark]'``: the config, the schema records); executors need only
Spark, since everything runs as Spark SQL expressions (no Python UDFs). Use ``--deploy-mode
client``, or ship the config file and a Python environment with ``--files``/``--archives``.

The streaming query is the one ``cdc run`` starts: same checkpoint, same tables, so a sink can
move between the two (never run both at once on one checkpoint). SIGTERM or SIGINT stops it after
the batch in flight; more of them change nothing (``stop_on_signals``: a burst cannot deadlock it,
and PySpark's own SIGINT handler is kept out, see ``main``). Exit codes are the worker's: 0
stopped, 75 failed and worth a restart (resumes from the checkpoint), 2 failed for good (the
message says why).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from cdc.api import CdcError, load_sink_settings, stop_on_signals

EXIT_OK, EXIT_PERMANENT, EXIT_RETRIABLE = 0, 2, 75


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_sinks.submit",
                                     description="Run a delta sink of a cdc config file on Spark.")
    parser.add_argument("config", help="the cdc config file (YAML)")
    parser.add_argument("sink", help="the name of a sink of type delta in it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from spark_sinks.delta import DeltaSink

    try:
        sink_config, log_config = load_sink_settings(args.config, args.sink)
    except KeyError as err:
        print(f"error: {err.args[0]} in {args.config}", file=sys.stderr)
        return EXIT_PERMANENT
    except CdcError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_PERMANENT
    if sink_config.type != "delta":
        print(f"error: sink {args.sink} is of type {sink_config.type}, not delta", file=sys.stderr)
        return EXIT_PERMANENT

    stop = stop_on_signals()
    # The sink runs on a thread of its own and this one only waits: a SparkContext made on the
    # main thread replaces the SIGINT handler with PySpark's, which calls the JVM from inside the
    # handler (cancelAllJobs) while the interrupted thread may be in the middle of a call to it
    # (Py4JNetworkError), then raises KeyboardInterrupt wherever that thread is.
    failed: list[BaseException] = []

    def run() -> None:
        try:
            DeltaSink(sink_config).run(stop, log=log_config)
        except BaseException as err:  # noqa: BLE001 - raised again on the main thread
            failed.append(err)

    thread = threading.Thread(target=run, name=f"cdc-{args.sink}", daemon=True)
    thread.start()
    thread.join()
    if failed and isinstance(failed[0], CdcError):
        print(f"error: {type(failed[0]).__name__}: {failed[0]}", file=sys.stderr)
        return EXIT_RETRIABLE if failed[0].retriable else EXIT_PERMANENT
    if failed:
        raise failed[0]
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
