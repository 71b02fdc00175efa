"""Joined documents (issue 29): a search document or cache entry built from rows of several tables
of one source, declared in a sink's ``documents:`` and kept from the log. A library of the
OpenSearch and Redis sinks, not a plugin of its own.

    declaration.py   the ``documents:`` models (root, children, lookups, any depth) and the checks
                     that need no table: names, ``as``, columns, what belongs to children and to
                     OpenSearch; ``DocumentFields``, the settings a sink's config gains
    shapes_check.py  the declaration against the captured shapes (``cdc validate``): columns,
                     keys, foreign-key arity and key families, topics, one source
    keys.py          key families (which column types encode alike) and the canonical key bytes a
                     foreign key meets the key it references by
    plan.py          the declaration compiled against the shapes: nodes, edges, what the state
                     keeps and indexes per table, projections, the digest a stored state is tied to

The engine that keeps documents (state, reach, assembly, versions; the design's step 2) is not
built yet: a sink with ``documents:`` refuses to run (``declaration.not_kept_yet``).
"""
