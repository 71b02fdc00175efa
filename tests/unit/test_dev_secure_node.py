"""The opensearch-secure node of the dev stack: started only when named, with the jars it needs."""

from __future__ import annotations

from cdc.dev import jars, stack


def test_a_plain_dev_up_does_not_start_the_secure_node_but_naming_it_does():
    assert "opensearch-secure" not in stack._check_names(None)
    assert "opensearch" in stack._check_names(None)
    assert stack._check_names(["opensearch-secure"]) == ["opensearch-secure"]


def test_the_secure_node_resolves_the_node_and_the_security_plugin():
    assert jars.components_of("opensearch-secure") == ("opensearch", "opensearch-security")
    assert jars.components_of("opensearch") == ("opensearch",)
    assert jars.components_of("postgres") == ()
