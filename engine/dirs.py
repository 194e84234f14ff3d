"""leapvox's own folders: the platform's usual ones (platformdirs, app name "leapvox"), or all under $LEAPVOX_HOME.
In the engine so that its compiled-kernel cache (engine/fast/kernels) follows the rule models/paths.py's folders do."""

from __future__ import annotations

import os
from pathlib import Path


def base_dirs() -> dict[str, Path]:
    """leapvox's data, config and cache folders; $LEAPVOX_HOME puts them all under one folder."""
    home = os.environ.get("LEAPVOX_HOME")
    if home:
        return {d: Path(home).expanduser() / d for d in ("data", "config", "cache")}
    from platformdirs import PlatformDirs

    d = PlatformDirs("leapvox", appauthor=False)
    return {"data": Path(d.user_data_dir), "config": Path(d.user_config_dir), "cache": Path(d.user_cache_dir)}
