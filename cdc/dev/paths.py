"""Where the local stack keeps its cache and its state."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Long-lived downloads (Maven jars): ``$CDC_CACHE_DIR``, else ``$XDG_CACHE_HOME/cdc-framework``."""
    explicit = os.environ.get("CDC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "cdc-framework"


def dev_home() -> Path:
    """State of the running stack and its dev.env: ``$CDC_DEV_HOME``, else ``./.cdc``."""
    return Path(os.environ.get("CDC_DEV_HOME") or Path.cwd() / ".cdc")


def env_file() -> Path:
    return dev_home() / "dev.env"


def state_file() -> Path:
    return dev_home() / "dev.json"
