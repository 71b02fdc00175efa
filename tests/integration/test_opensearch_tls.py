"""The OpenSearch sink against a node with TLS and authentication: the stack's ``opensearch-secure``
(the security plugin, TLS on HTTP with a CA of its own, internal users; cdc/dev/secure_node.py).

The sink is configured from a config file as a user would: an https URL, ``ca_file``, the user
from the environment and its password from ``password_file``; it writes as ``cdc_sink``, a user
that is not an admin. A wrong CA or a wrong password is a ``ConfigError`` that names the URL and
not the password, raised at once by the runtime (never retried). With a client certificate
(``client_cert_file``, ``client_key_file``) and no password, the node's clientcert authentication
takes the certificate as ``cdc_sink``: what OpenSearch 2.x offers instead of API keys.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from opensearchpy import OpenSearch

from cdc.config import parse_config
from cdc.errors import ConfigError
from cdc.events import ChangeEvent, Op
from cdc.runtime.sink_runner import SinkRunner
from sinks.opensearch import OpenSearchSink
from sinks.opensearch.generations import STATE_INDEX
from tests.integration.pg_capture import embedded_log  # noqa: F401 - the fixture ``log``
from tests.integration.redis_tls import make_tls_files
from tests.integration.test_opensearch_sink import TABLE, _documents, _publish, _row

pytestmark = pytest.mark.opensearch


@pytest.fixture(scope="module")
def secure(dev_env_for) -> dict[str, str]:
    return dev_env_for("opensearch-secure")


@pytest.fixture
def admin(secure):
    password = Path(secure["OPENSEARCH_SECURE_ADMIN_PASSWORD_FILE"]).read_text()
    client = OpenSearch(secure["OPENSEARCH_SECURE_URL"], http_auth=("admin", password), use_ssl=True,
                        verify_certs=True, ca_certs=secure["OPENSEARCH_SECURE_CA_FILE"])
    yield client
    client.close()


@pytest.fixture
def name(admin):
    unique = f"t_{uuid.uuid4().hex[:10]}"
    yield unique
    admin.indices.delete(index=f"{unique}.*", params={"ignore_unavailable": "true"})
    admin.delete(index=STATE_INDEX, id=unique, params={"ignore": 404})


def _sink(tmp_path: Path, secure: dict[str, str], name: str, **fields) -> OpenSearchSink:
    """The sink as a config file makes it: user from ${VAR}, password from a file, the CA file."""
    settings = {"hosts": "['${OPENSEARCH_SECURE_URL}']", "username": "'${OPENSEARCH_SECURE_USER}'",
                "password_file": "'${OPENSEARCH_SECURE_PASSWORD_FILE}'",
                "ca_file": "'${OPENSEARCH_SECURE_CA_FILE}'", **fields}
    body = ", ".join(f"{k}: {v}" for k, v in settings.items() if v is not None)  # None: left out
    text = (f"log: {{embedded: {{path: '{tmp_path / 'unused'}'}}}}\nhttp: null\n"
            f"sinks:\n  - {{name: {name}, type: opensearch, topics: ['p.*'], index_name: '{name}.{{table}}', "
            f"batch_size: 50, batch_wait_ms: 10, drop_old_generation_after_s: 0, {body}}}\n")
    config = parse_config(text, file="cdc.yaml", base_dir=tmp_path, env=secure)
    return OpenSearchSink(config.sinks[0])


def _run(sink: OpenSearchSink, log) -> SinkRunner:
    runner = SinkRunner(sink, log, "p")
    runner.run(threading.Event(), until_caught_up=True)
    return runner


def test_the_sink_writes_over_tls_as_a_user_that_is_not_an_admin(tmp_path, secure, admin, log, name):
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": i}, None, _row(i, 10 + i), 10 + i, 0) for i in range(40)]
    events += [ChangeEvent(Op.DELETE, TABLE, {"id": i}, _row(i, 10 + i), None, 100 + i, 0) for i in range(0, 40, 4)]
    _publish(log, events)
    sink = _sink(tmp_path, secure, name)
    assert sink.config.hosts[0].startswith("https://") and sink.config.username == "cdc_sink"
    _run(sink, log)
    expected = {i: _row(i, 10 + i) for i in range(40) if i % 4}
    assert _documents(admin, f"{name}.items") == expected
    # The user the sink wrote as is no admin: the security API refuses it.
    password = Path(secure["OPENSEARCH_SECURE_PASSWORD_FILE"]).read_text()
    as_sink = OpenSearch(secure["OPENSEARCH_SECURE_URL"], http_auth=("cdc_sink", password), use_ssl=True,
                         ca_certs=secure["OPENSEARCH_SECURE_CA_FILE"])
    try:
        who = as_sink.transport.perform_request("GET", "/_plugins/_security/authinfo")
        assert who["user_name"] == "cdc_sink" and who["roles"] == ["cdc_sink"]
        refused = as_sink.transport.perform_request("GET", "/_plugins/_security/api/internalusers",
                                                    params={"ignore": 403})
        assert refused.get("status") == "FORBIDDEN"
    finally:
        as_sink.close()


def test_a_ca_that_did_not_sign_the_node_is_a_config_error_naming_the_url(tmp_path, secure, log, name):
    other_ca = make_tls_files(tmp_path / "tls").other_ca
    _publish(log, [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, _row(1, 1), 1, 0)])
    sink = _sink(tmp_path, secure, name, ca_file=f"'{other_ca}'")
    with pytest.raises(ConfigError) as caught:
        _run(sink, log)  # raised at start: not retried
    message = str(caught.value)
    assert secure["OPENSEARCH_SECURE_URL"] in message and "ca_file" in message
    assert "certificate verify failed" in message or "self-signed" in message or "unable to get" in message


def test_a_wrong_password_is_a_config_error_naming_the_url_not_the_password(tmp_path, secure, log, name):
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password-4711")
    _publish(log, [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, _row(1, 1), 1, 0)])
    sink = _sink(tmp_path, secure, name, password_file=f"'{wrong}'")
    with pytest.raises(ConfigError) as caught:
        _run(sink, log)
    message = str(caught.value)
    assert secure["OPENSEARCH_SECURE_URL"] in message and "401" in message and "password" in message
    assert "not-the-password-4711" not in message
    assert not caught.value.retriable


def test_credentials_written_into_the_url_stay_out_of_messages(tmp_path, secure, log, name):
    url = secure["OPENSEARCH_SECURE_URL"].replace("https://", "https://cdc_sink:in-url-secret-99@")
    _publish(log, [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, _row(1, 1), 1, 0)])
    sink = _sink(tmp_path, secure, name, hosts=f"['{url}']", username=None, password_file=None)
    with pytest.raises(ConfigError) as caught:
        _run(sink, log)
    message = str(caught.value)
    assert "in-url-secret-99" not in message and secure["OPENSEARCH_SECURE_URL"] in message


def test_the_sink_authenticates_with_a_client_certificate_and_no_password(tmp_path, secure, admin, log, name):
    """OpenSearch 2.x has no API keys; what it has for a service without a password is a client
    certificate: the node's ``clientcert`` domain takes the certificate's CN (``cdc_sink``) as
    the user. The sink is configured with the certificate and its key, and no username or
    password at all."""
    events = [ChangeEvent(Op.CREATE, TABLE, {"id": i}, None, _row(i, 10 + i), 10 + i, 0) for i in range(20)]
    events += [ChangeEvent(Op.DELETE, TABLE, {"id": i}, _row(i, 10 + i), None, 100 + i, 0) for i in range(0, 20, 5)]
    _publish(log, events)
    sink = _sink(tmp_path, secure, name, username=None, password_file=None,
                 client_cert_file="'${OPENSEARCH_SECURE_CLIENT_CERT_FILE}'",
                 client_key_file="'${OPENSEARCH_SECURE_CLIENT_KEY_FILE}'")
    assert sink.config.username is None and sink.config.password is None and sink.config.client_cert_file
    _run(sink, log)
    assert _documents(admin, f"{name}.items") == {i: _row(i, 10 + i) for i in range(20) if i % 5}
    # The node took the certificate as the user cdc_sink (not an admin), with no password sent.
    as_cert = OpenSearch(secure["OPENSEARCH_SECURE_URL"], use_ssl=True, ca_certs=secure["OPENSEARCH_SECURE_CA_FILE"],
                         client_cert=secure["OPENSEARCH_SECURE_CLIENT_CERT_FILE"],
                         client_key=secure["OPENSEARCH_SECURE_CLIENT_KEY_FILE"])
    try:
        who = as_cert.transport.perform_request("GET", "/_plugins/_security/authinfo")
        assert who["user_name"] == "cdc_sink" and who["roles"] == ["cdc_sink"]
    finally:
        as_cert.close()


def test_without_credentials_or_certificate_the_node_refuses_with_a_config_error(tmp_path, secure, log, name):
    """The counterpart of the test above: the same sink with neither password nor certificate is
    refused (401), so it is the certificate that authenticated it there."""
    _publish(log, [ChangeEvent(Op.CREATE, TABLE, {"id": 1}, None, _row(1, 1), 1, 0)])
    sink = _sink(tmp_path, secure, name, username=None, password_file=None)
    with pytest.raises(ConfigError) as caught:
        _run(sink, log)
    assert "401" in str(caught.value) and "client_cert_file" in str(caught.value)
