"""cdc/renames.py: the renames of the shapes a table skips, chained (used by the sql and Delta sinks)."""

from __future__ import annotations

from cdc.api import earlier_names, renames_to_follow


def _shape(*columns: str | tuple[str, str]) -> dict:
    """A schema record: a name, or (name, renamed_from)."""
    return {"columns": [{"name": c, "type": "text"} if isinstance(c, str) else
                        {"name": c[0], "type": "text", "renamed_from": c[1]} for c in columns]}


def test_each_column_of_the_last_shape_gets_the_names_it_had_newest_first():
    shapes = [_shape("id", "a", "x"), _shape("id", ("b", "a"), "x"), _shape("id", ("c", "b"), ("y", "x"))]
    assert earlier_names(shapes) == {"id": (), "c": ("b", "a"), "y": ("x",)}
    # A name used again by a new column (c dropped, a new a) starts a new history.
    assert earlier_names([*shapes, _shape("id", "a"), _shape("id", ("z", "a"))]) == {"id": (), "z": ("a",)}


def test_a_table_renames_its_newest_earlier_name_and_keeps_the_ones_in_between():
    earlier = earlier_names([_shape("id", "a"), _shape("id", ("b", "a")), _shape("id", ("c", "b"))])
    assert renames_to_follow(earlier, ["id", "a"]) == {"c": ("a", ("b",))}
    assert renames_to_follow(earlier, ["id", "b", "a"]) == {"c": ("b", ())}   # b is newer than a
    assert renames_to_follow(earlier, ["id", "c", "a"]) == {}                 # renamed already
    assert renames_to_follow(earlier, ["ID", "A"], str.lower) == {"c": ("A", ("b",))}
    assert renames_to_follow(earlier, ["ID", "A"]) == {}                      # names compared as they are


def test_an_old_name_the_shape_still_uses_is_not_renamed():
    # a -> b, and a new column named a: the table's a is b's, but the shape has an a of its own.
    earlier = earlier_names([_shape("id", "a"), _shape("id", ("b", "a"), "a")])
    assert renames_to_follow(earlier, ["id", "a"]) == {}
