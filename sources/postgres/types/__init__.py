"""PostgreSQL values, from their text output to the JSON the change events carry.

Both the snapshot (``COPY ... TO STDOUT``, text format) and the stream (pgoutput) deliver each
value as its type's text output, under the same fixed ``SESSION_SETTINGS``. One converter per
column (``converter_for``) turns that text into the contract's JSON value, so a snapshot row and
a streamed row with the same contents serialize identically by construction.

    session      SESSION_SETTINGS, session_options(): the libpq ``options`` for both connections
    catalog      TypeInfo, load_type_catalog(): type families from pg_type / pg_range
    scalars      built-in scalar converters (and what each keeps as text, and why)
    arrays       array text format; ranges: range/multirange text; hstore: hstore text
    converters   converter_for(), convert_row()
    copy_text    parse_copy_text_line(), iter_copy_batches(), iter_copy_rows()
"""

from sources.postgres.types.catalog import BUILTIN_TYPES, TypeInfo, TypeKind, load_type_catalog
from sources.postgres.types.converters import convert_row, converter_for
from sources.postgres.types.copy_text import iter_copy_batches, iter_copy_rows, parse_copy_text_line
from sources.postgres.types.scalars import Converter
from sources.postgres.types.session import SESSION_SETTINGS, session_options

__all__ = [
    "BUILTIN_TYPES", "SESSION_SETTINGS", "Converter", "TypeInfo", "TypeKind", "convert_row",
    "converter_for", "iter_copy_batches", "iter_copy_rows", "load_type_catalog",
    "parse_copy_text_line", "session_options",
]
