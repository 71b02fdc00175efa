"""Running connectors: one source driven end to end (``runner``), in a process of its own
(``worker``), supervised with restarts and a clean drain (``supervisor``), observed over HTTP
(``http``: /healthz, /metrics, /status) from the figures each worker reports (``stats``)."""
