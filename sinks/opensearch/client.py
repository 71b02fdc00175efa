"""The opensearch-py client of one sink: hosts, basic auth or an API key, TLS.

TLS is on for ``https://`` hosts, with certificate verification on unless ``verify_certs: false``
(``ca_file`` names the CA that signs the nodes' certificates). Secrets come from the config
(``password_file``/``api_key_file`` read by the config loader) and never appear in logs. The
client does not retry by itself: the sink classifies each failure (errors.py) and the runtime
retries whole batches.
"""

from __future__ import annotations

from typing import Any

from sinks.opensearch.config import OpenSearchSinkConfig


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
    if config.api_key is not None:
        kwargs["headers"] = {"Authorization": f"ApiKey {config.api_key.get_secret_value()}"}
    if any(host.startswith("https://") for host in config.hosts):
        kwargs["use_ssl"] = True
        kwargs["verify_certs"] = config.verify_certs
        kwargs["ssl_show_warn"] = config.verify_certs
        if config.ca_file:
            kwargs["ca_certs"] = config.ca_file
    return OpenSearch(**kwargs)
