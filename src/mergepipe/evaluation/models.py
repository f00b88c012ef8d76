"""A registered model as a transformers causal LM (float32, CPU) and its tokenizer, from the files
beside its weights; only local full checkpoints run (an adapter or a delta is not a model)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.lifecycle import resolve_key
from mergepipe.catalog.models import find_model
from mergepipe.core.errors import Conflict, InvalidCheckpoint, InvalidRequest, NotFound
from mergepipe.storage.locations import is_url

EXTRA = "eval"
CONFIG_FILE = "config.json"
# Any of these beside the weights: the model has a tokenizer of its own.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


class MissingExtra(InvalidRequest, status=501, code="missing_extra"):
    """The optional dependencies that running a model needs are not installed."""


def transformers() -> Any:
    """The transformers module, or MissingExtra naming the extra that installs it."""
    try:
        return importlib.import_module("transformers")
    except ModuleNotFoundError:
        raise MissingExtra(f"running a model needs transformers, which is not installed: "
                           f"pip install 'mergepipe[{EXTRA}]'", field=EXTRA) from None


@dataclass(frozen=True)
class LocalModel:
    """A registered full model on local disk: its name, directory and weight files."""

    name: str
    directory: Path
    weights: tuple[Path, ...]

    @property
    def has_tokenizer(self) -> bool:
        return any((self.directory / f).is_file() for f in TOKENIZER_FILES)


def local_model(cat: Catalog, ref: str, field: str) -> LocalModel:
    """The model `ref` names (a name or `name~N`), checked runnable: registered, ready, a full
    checkpoint on local disk with a config.json. The error names `field` and the model."""
    row = find_model(cat, resolve_key(cat, ref))
    if row is None or row.retired_at is not None:
        raise NotFound(f"model {ref!r} not found", field=field)
    if row.status != "ready":
        raise Conflict(f"model {ref!r} is {row.status}, not ready", field=field)
    if row.kind != "full":
        raise InvalidRequest(f"model {ref!r} is a {row.kind} checkpoint, not a model by "
                             "itself: merge it into its base first", field=field)
    if is_url(row.path):
        raise InvalidRequest(f"model {ref!r} lies at {row.path}: only local checkpoints run "
                             "(download it and ingest the copy)", field=field)
    path = Path(row.path)
    directory = path if path.is_dir() else path.parent
    weights = (tuple(sorted(directory.glob("*.safetensors"))) if path.is_dir() else (path,))
    if not weights or not all(w.is_file() for w in weights):
        raise NotFound(f"model {ref!r}: no safetensors file at {row.path}", field=field)
    if not (directory / CONFIG_FILE).is_file():
        raise InvalidRequest(f"model {ref!r} has no {CONFIG_FILE} beside its weights in "
                             f"{directory}: its architecture is unknown", field=field)
    return LocalModel(row.name, directory, weights)


def load_lm(model: LocalModel, field: str) -> Any:
    """The model as a transformers causal LM in float32, eval mode, its weights loaded from
    its safetensors files (tied weights may be absent; any other missing or unknown tensor is
    refused, naming it)."""
    import torch
    from safetensors.torch import load_file

    tf = transformers()
    try:
        config = tf.AutoConfig.from_pretrained(str(model.directory))
        lm = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - transformers parsing a user's file: any refusal
        raise InvalidCheckpoint(f"model {model.name!r}: {model.directory / CONFIG_FILE} does "
                                f"not describe a causal LM transformers knows: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}",
                                field=field) from None
    state: dict[str, Any] = {}
    for w in model.weights:
        state.update(load_file(str(w)))
    try:
        result = lm.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape that does not match the config
        raise InvalidCheckpoint(f"model {model.name!r}: its weights do not fit its "
                                f"{CONFIG_FILE}: {str(e).splitlines()[-1].strip()}",
                                field=field) from None
    if result.unexpected_keys:
        raise InvalidCheckpoint(f"model {model.name!r}: tensor {result.unexpected_keys[0]!r} "
                                f"is not part of the architecture in its {CONFIG_FILE}",
                                field=field)
    lm.tie_weights()
    loaded = {lm.get_parameter(k).data_ptr() for k in state if _is_param(lm, k)}
    for k in result.missing_keys:
        if not _is_param(lm, k) or lm.get_parameter(k).data_ptr() not in loaded:
            raise InvalidCheckpoint(f"model {model.name!r}: its files have no tensor {k!r}",
                                    field=field)
    return lm.eval()


def _is_param(lm: Any, key: str) -> bool:
    try:
        lm.get_parameter(key)
    except AttributeError:
        return False
    return True


def load_tokenizer(model: LocalModel, field: str) -> Any:
    """The tokenizer in the model's directory; InvalidRequest naming the model without one."""
    if not model.has_tokenizer:
        raise InvalidRequest(f"model {model.name!r} has no tokenizer files beside its weights "
                             f"({', '.join(TOKENIZER_FILES)}): name a model whose tokenizer "
                             "to use", field=field)
    try:
        return transformers().AutoTokenizer.from_pretrained(str(model.directory))
    except Exception as e:  # noqa: BLE001 - transformers parsing a user's files: any refusal
        raise InvalidCheckpoint(f"model {model.name!r}: its tokenizer files cannot be read: "
                                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}",
                                field=field) from None
