"""The opensearch-py client of one sink: hosts, basic auth and/or a client certificate, TLS.

TLS is on for ``https://`` hosts, with certificate verification on unless ``verify_certs: false``
(``ca_file`` names the CA that signs the nodes' certificates). ``client_cert_file`` (and
``client_key_file``) is presented in the TLS handshake: a node whose security plugin has
clientcert authentication takes the certificate's subject as the user, with no password. The
password comes from the config (``password_file`` read by the config loader) and never appears in
logs. The client does not retry by itself: the sink classifies each failure (errors.py) and the
runtime retries whole batches.
"""

from __future__ import annotations

import ssl
from typing import Any

from cdc.api import ConfigError
from sinks.opensearch.config import OpenSearchSinkConfig


def _check_client_certificate(config: OpenSearchSinkConfig, cert_file: str) -> None:
    """Load the certificate (``cert_file``, the config's ``client_cert_file``) and key once here:
    urllib3 would load them at each connection and report a missing or mismatched file as a
    connection error, which the runtime retries forever."""
    try:
        ssl.create_default_context().load_cert_chain(cert_file, config.client_key_file)
    except (OSError, ssl.SSLError) as err:
        files = " and ".join(f"{name} {path}" for name, path in (("client_cert_file", config.client_cert_file),
                                                                  ("client_key_file", config.client_key_file)) if path)
        raise ConfigError(f"opensearch sink {config.name}: {files}: not a readable PEM certificate and its "
                          f"private key ({type(err).__name__}: {getattr(err, 'strerror', None) or err})") from None


def make_client(config: OpenSearchSinkConfig):
    from opensearchpy import OpenSearch

    kwargs: dict[str, Any] = {
        "hosts": list(config.hosts),
        "timeout": config.request_timeout_s,
        "max_retries": 0,
        "retry_on_timeout": False,
        "pool_maxsize": max(4, 2 * config.bulk_concurrency),
    }
    if config.username is not None and config.password is not None:
        kwargs["http_auth"] = (config.username, config.password.get_secret_value())
    if any(host.startswith("https://") for host in config.hosts):
        kwargs["use_ssl"] = True
        kwargs["verify_certs"] = config.verify_certs
        kwargs["ssl_show_warn"] = config.verify_certs
        if config.ca_file:
            kwargs["ca_certs"] = config.ca_file
        if config.client_cert_file:
            _check_client_certificate(config, config.client_cert_file)
            kwargs["client_cert"] = config.client_cert_file
            if config.client_key_file:
                kwargs["client_key"] = config.client_key_file
    return OpenSearch(**kwargs)
