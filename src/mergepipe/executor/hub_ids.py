"""The Hugging Face Hub ids of a merge's input models, for the model card's `base_model`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from mergepipe.catalog.models import ModelRow
from mergepipe.core.errors import MergePipeError
from mergepipe.storage.locations import basename, is_url, join, parent, parse_url
from mergepipe.storage.store import store_for

# the Hub's repository id: a namespace and a name of letters, digits, '-', '_' and '.'
HUB_ID = re.compile(r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9_.-]{1,96}")
_CACHE = re.compile(r"(?:^|/)models--([\w.-]+?)--([\w.-]+)/snapshots/")
MAX_CONFIG_BYTES = 1 << 20


def hub_ids(models: Iterable[ModelRow]) -> dict[str, str]:
    """Catalog name -> Hub id, for the models that record one."""
    out = {}
    for m in models:
        found = None if m.source_merge else hub_id(m.path)
        if found is not None:
            out[m.name] = found
    return out


def hub_id(path: str) -> str | None:
    """The Hub id of the checkpoint at `path` (a directory or one .safetensors file)."""
    directory = parent(path) if basename(path).endswith(".safetensors") else path
    if is_url(directory):
        url = parse_url(directory)
        repo = f"{url.authority}/{url.key.split('/', 1)[0].partition('@')[0]}"
        return repo if url.scheme == "hf" and _valid(repo) else None
    m = _CACHE.search(directory.rstrip("/") + "/")
    if m and _valid(f"{m.group(1)}/{m.group(2)}"):
        return f"{m.group(1)}/{m.group(2)}"
    try:
        cfg = json.loads(store_for(directory).read_bytes(join(directory, "config.json"),
                                                         MAX_CONFIG_BYTES))
    except (OSError, ValueError, RecursionError, MergePipeError):  # absent, outside the
        return None  # roots, unreadable, not JSON
    name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    return name if isinstance(name, str) and _valid(name) else None


def _valid(name: str) -> bool:
    return HUB_ID.fullmatch(name) is not None and ".." not in name and "--" not in name \
        and not name.startswith(".")
