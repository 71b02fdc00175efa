"""The optional C part: cdc/_speedups.c (the encoding loop). Without a compiler the build goes on
without it, and cdc.serde runs its Python loop (the same bytes, slower)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("cdc._speedups", ["cdc/_speedups.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
