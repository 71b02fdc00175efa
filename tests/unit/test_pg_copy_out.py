"""When the snapshot's C COPY loop may drive psycopg2's connections (sources/postgres/copy_out.py):
only when psycopg2 runs on the libpq the loop is linked to, never on a copy its wheel bundles."""

from __future__ import annotations

from sources.postgres.copy_out import refusal

SOURCE_BUILD = ["psycopg2/__init__.py", "psycopg2/_psycopg.cpython-311-x86_64-linux-gnu.so",
                "psycopg2_binary-2.9.13.dist-info/RECORD"]
WHEEL = SOURCE_BUILD + ["psycopg2_binary.libs/libpq-a17e3caa.so.5.17",
                        "psycopg2_binary.libs/libssl-81ffa89e.so.3"]


def test_a_psycopg2_built_on_the_same_libpq_is_driven():
    assert refusal(SOURCE_BUILD, 150018, 150018) is None


def test_a_wheel_with_its_own_libpq_is_refused_even_at_the_same_version():
    why = refusal(WHEEL, 170011, 170011)
    assert why is not None and "psycopg2_binary.libs/libpq-a17e3caa.so.5.17" in why and "--no-binary" in why


def test_another_libpq_version_is_refused():
    why = refusal(SOURCE_BUILD, 150018, 160004)
    assert why is not None and "160004" in why and "150018" in why
