"""Run one self-driven sink of a config file outside the daemon: ``cdc run-sink``, or this file
under ``spark-submit`` (a delta sink on a Spark cluster).

    cdc run-sink CONFIG SINK                      # locally (a delta sink: master from its spark.master)
    python -m cdc.runtime.submit CONFIG SINK      # the same

    spark-submit --master yarn --deploy-mode client \\
      --jars "$(python -m cdc.dev.jars)" \\
      --conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension \\
      --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog \\
      --conf spark.sql.codegen.cache.maxEntries=1000 \\
      "$(python -c 'import cdc.runtime.submit as m; print(m.__file__)')" cdc.yaml lake

The sink (a ``SelfDrivenSink``: it reads the topics with its own machinery and owns its position)
gets the runtime's context, as under ``cdc run``, so a sink can move between the two (never run
both at once: a delta sink's checkpoint is one query's). spark_sinks/README.md says what the jars
and settings are for.

SIGTERM or SIGINT stops it after the work in flight; more of them change nothing
(``stop_on_signals``: a burst cannot deadlock it). The sink runs on a thread of its own and the
main thread only waits, in slices (a wait without a timeout can miss a signal for good: see
``cdc.runtime.stop_signals``): a SparkContext made on the main thread replaces the SIGINT handler with
PySpark's, which calls the JVM from inside the handler (cancelAllJobs) while the interrupted
thread may be in the middle of a call to it (Py4JNetworkError), then raises KeyboardInterrupt
wherever that thread is (tests/faults/test_spark_stop_storm.py). Exit codes are the worker's: 0
stopped, 75 failed and worth a restart (a delta sink resumes from its checkpoint), 2 failed for
good (the message says why). SIGUSR1 prints every thread's Python stack to stderr and changes
nothing else: what an operator (or a test) asks of a stop that takes long.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from cdc.errors import CdcError

EXIT_OK, EXIT_PERMANENT, EXIT_RETRIABLE = 0, 2, 75


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run-sink", help="run one self-driven sink (e.g. delta) outside the daemon")
    _arguments(parser)
    parser.set_defaults(handler=lambda args: run_sink(args.config, args.sink))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="the cdc config file (YAML)")
    parser.add_argument("sink", help="the name of a self-driven sink in it (e.g. of type delta)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc.runtime.submit",
                                     description="Run one self-driven sink of a cdc config file.")
    _arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_sink(args.config, args.sink)


def run_sink(config_path: str, name: str) -> int:
    from cdc.api import SelfDrivenSink
    from cdc.config import load_config
    from cdc.plugins import sink_class
    from cdc.runtime.contexts import sink_context
    from cdc.runtime.stop_signals import join_in_slices, stacks_on_sigusr1, stop_on_signals

    try:
        config = load_config(config_path, only=[name])
        sink_config = config.sink(name)
        plugin = sink_class(sink_config)
    except KeyError as err:
        print(f"error: {err.args[0]} in {config_path}", file=sys.stderr)
        return EXIT_PERMANENT
    except CdcError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_PERMANENT
    if not issubclass(plugin, SelfDrivenSink):
        print(f"error: sink {name} ({sink_config.type}) is driven by the runtime, not by itself: run it with "
              f"cdc run", file=sys.stderr)
        return EXIT_PERMANENT

    sink = plugin(sink_config)
    sink.attach(sink_context(name, log_config=config.log))
    stacks_on_sigusr1()
    stop = stop_on_signals()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            sink.run(stop)
        except BaseException as err:  # noqa: BLE001 - raised again on the main thread
            failed.append(err)

    thread = threading.Thread(target=run, name=f"cdc-{name}", daemon=True)
    thread.start()
    join_in_slices(thread)  # never a plain join(): it can miss a signal for good
    if failed and isinstance(failed[0], CdcError):
        print(f"error: {type(failed[0]).__name__}: {failed[0]}", file=sys.stderr)
        return EXIT_RETRIABLE if failed[0].retriable else EXIT_PERMANENT
    if failed:
        raise failed[0]
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
