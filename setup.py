"""The optional C parts, one concern each: cdc/_encode.c (a capture's envelope encoding loop),
cdc/_avro.c (Avro binary of a compiled schema), cdc/_decode.c (the sink side's envelope decoders and
the cut by shape), cdc/_copytext.c (SQL COPY text of rows left as JSON bytes), cdc/_records.c (Kafka
messages to records, the produce call, packed record headers), cdc/_window.c (the newest version per
key of a bulk load's window), sinks/opensearch/_lines.c (the OpenSearch sink's reduction and bulk
lines), sources/mysql/_rowdecode.c (binlog row images of the common column types),
sources/postgres/_copyjson.c (the snapshot's row JSON from COPY text, and its COPY read in blocks
over the system's libpq, built only where libpq's headers are: apt's libpq-dev), cdc/_rdconsume.c (a
bulk load's Kafka reader) and cdc/_rdproduce.c (snapshot rows to Kafka a block per call), both
linked to the system's librdkafka: apt's librdkafka-dev. Helpers that two of them share are in
headers (cdc/_*.h), a copy in each. An extension of several files (its units: the file above and
<name>_*.c) declares what they share in a private header of its own name (e.g. cdc/_window.h).
Without a compiler (or librdkafka's headers) the build goes on without them, and the Python code
they mirror runs instead (the same output, slower); cdc/native.py is the switch."""

import shutil
import subprocess

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]


def libpq() -> dict:
    """Extension arguments that link the system's libpq (pg_config's), or none without its headers."""
    if shutil.which("pg_config") is None:
        return {}
    try:
        include, lib = (subprocess.run(["pg_config", option], capture_output=True, text=True, check=True).stdout.strip()
                        for option in ("--includedir", "--libdir"))
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"define_macros": [("CDC_WITH_LIBPQ", "1")], "include_dirs": [include], "library_dirs": [lib],
            "libraries": ["pq"]}


setup(ext_modules=[
    Extension("cdc._encode", ["cdc/_encode.c"], depends=["cdc/_inttext.h", "cdc/_logrecord.h", "cdc/_rowblock.h"],
              optional=True, extra_compile_args=FLAGS),
    Extension("cdc._avro", ["cdc/_avro.c"], optional=True, extra_compile_args=FLAGS),
    Extension("cdc._decode", ["cdc/_decode.c", "cdc/_decode_one.c"],
              depends=["cdc/_decode.h", "cdc/_jsonscan.h", "cdc/_logrecord.h"], optional=True, extra_compile_args=FLAGS),
    Extension("cdc._copytext", ["cdc/_copytext.c"], depends=["cdc/_inttext.h", "cdc/_jsonscan.h"], optional=True,
              extra_compile_args=FLAGS),
    Extension("cdc._records", ["cdc/_records.c"], depends=["cdc/_logrecord.h"], optional=True,
              extra_compile_args=FLAGS),
    Extension("cdc._window", ["cdc/_window.c", "cdc/_window_add.c", "cdc/_window_scan.c", "cdc/_window_table.c"],
              depends=["cdc/_logrecord.h", "cdc/_window.h"], optional=True, extra_compile_args=FLAGS),
    Extension("sinks.opensearch._lines", ["sinks/opensearch/_lines.c", "sinks/opensearch/_lines_raw.c",
                                          "sinks/opensearch/_lines_reduce.c"],
              depends=["sinks/opensearch/_lines.h"], optional=True, extra_compile_args=FLAGS),
    Extension("sources.mysql._rowdecode", ["sources/mysql/_rowdecode.c", "sources/mysql/_rowdecode_image.c"],
              depends=["sources/mysql/_rowdecode.h"], optional=True, extra_compile_args=FLAGS),
    Extension("sources.postgres._copyjson", ["sources/postgres/_copyjson.c", "sources/postgres/_copyjson_keys.c",
                                             "sources/postgres/_copyjson_out.c"],
              depends=["sources/postgres/_copyjson.h"], optional=True, extra_compile_args=FLAGS, **libpq()),
    Extension("cdc._rdconsume", ["cdc/_rdconsume.c"], optional=True, extra_compile_args=FLAGS,
              libraries=["rdkafka"]),
    Extension("cdc._rdproduce", ["cdc/_rdproduce.c", "cdc/_rdproduce_rows.c"],
              depends=["cdc/_rdproduce.h", "cdc/_rowblock.h"], optional=True, libraries=["rdkafka"],
              extra_compile_args=FLAGS),
])
