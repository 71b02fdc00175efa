"""Opening a Redis sink's server or cluster: the client, the version guard's scripts, the
generations of its namespace (shared by the table sink and the document sink)."""

from __future__ import annotations

from typing import Any

from cdc.api import PermanentError
from sinks.redis.client import command_known, connect, redacted_url, translate
from sinks.redis.config import RedisSinkConfig
from sinks.redis.generations import Generations
from sinks.redis.pipeline import ScriptPipeline


def open_server(config: RedisSinkConfig) -> tuple[Any, ScriptPipeline, Generations, int]:
    """The client, its script pipeline (scripts loaded), the generations of the sink's namespace
    and the current one, on the configured server or cluster (a drop cut short before is
    resumed)."""
    try:
        client = connect(config)
        client.ping()
        if config.format == "redisjson":
            require_redisjson(config, client)
        pipeline = ScriptPipeline(client, config.name, config.pipeline_size, config.max_retries)
        pipeline.load_scripts()
        generations = Generations(client, config.prefix, config.name)
        current = generations.current()
        generations.resume_drops()
    except PermanentError:
        raise
    except Exception as err:  # noqa: BLE001 - classified
        raise translate(err, f"redis sink {config.name}: connecting to "
                             f"{redacted_url(config.url.get_secret_value())}") from err
    return client, pipeline, generations, current


def require_redisjson(config: RedisSinkConfig, client) -> None:
    if config.cluster:
        servers = [(node.name, client.get_redis_connection(node)) for node in client.get_primaries()]
    else:
        servers = [(redacted_url(config.url.get_secret_value()), client)]
    missing = [f"{name} (MODULE LIST: {_modules(server)})" for name, server in servers
               if not command_known(server, "JSON.SET")]
    if missing:
        where = "" if not config.cluster else f" of the cluster at {redacted_url(config.url.get_secret_value())}"
        raise PermanentError(f"redis sink {config.name}: format redisjson needs the RedisJSON module "
                             f"(command JSON.SET), which {', '.join(missing)}{where} "
                             f"{'does' if len(missing) == 1 else 'do'} not have; load it "
                             f"(Redis Stack, Redis 8, valkey-json) or use format: json")


def _modules(server) -> str:
    """What ``MODULE LIST`` answers, in a few words (for the redisjson refusal)."""
    try:
        modules = server.module_list()
    except Exception as err:  # noqa: BLE001 - only said in the message
        return f"refused: {err}"
    found = [m.get(b"name", m.get("name")) if isinstance(m, dict) else m for m in modules]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in found]
    return ", ".join(names) if names else "no modules loaded"
