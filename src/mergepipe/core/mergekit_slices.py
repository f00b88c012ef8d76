"""mergekit `slices:` configs (layer stacking, frankenmerges), parsed and checked; no file access.
A slice takes the layers [a, b) of its sources; the output stacks the slices and renumbers their
layers from 0. `passthrough` copies each slice's one source (times its `scale`). Another method
runs as the `models:` config it equals: one slice whose sources take every layer of their models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mergepipe.core.errors import InvalidRequest
from mergepipe.core.mergekit_params import as_mapping, dtypes
from mergepipe.core.tensor_params import Setting, canonical, resolve

PASSTHROUGH = "passthrough"
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # config.json's layer count
_SLICE_KEYS = {"sources", "parameters"}
_SOURCE_KEYS = {"model", "layer_range", "parameters"}
_TOP_KEYS = {"merge_method", "base_model", "slices", "models", "parameters", "dtype", "out_dtype",
             "tokenizer_source", "tokenizer", "chat_template"}


@dataclass(frozen=True)
class SliceSource:
    key: str  # the YAML key of the entry, e.g. "slices[1].sources[0]"
    model: str  # as written
    start: int
    end: int
    scale: Setting | None = None  # passthrough's own `scale` of this source


@dataclass(frozen=True)
class Slice:
    key: str
    sources: tuple[SliceSource, ...]
    scale: Setting | None = None  # the slice's `scale`

    @property
    def layers(self) -> int:
        return self.sources[0].end - self.sources[0].start


@dataclass(frozen=True)
class SliceConfig:
    """A passthrough `slices:` config: what each output layer copies."""

    base: str | None  # base_model as written: the donor of config.json (else the first source)
    slices: tuple[Slice, ...]
    scale: Setting | None  # the global `parameters: {scale}`
    compute_dtype: str  # as MergekitConfig's ("files": the inputs' own)
    output_dtype: str | None
    notes: tuple[str, ...] = ()

    @property
    def layers(self) -> int:
        return sum(s.layers for s in self.slices)

    @property
    def donor(self) -> str:
        return self.base or self.slices[0].sources[0].model

    def scale_of(self, piece: Slice, tensor: str, t: float) -> float | None:
        """The `scale` of an output tensor: its source's setting, the slice's, then the global
        one, the first that gives a value (None: copied as is)."""
        chain = [s for s in (piece.sources[0].scale, piece.scale, self.scale) if s is not None]
        return resolve(chain, tensor, t)


def parse_slices(doc: dict[Any, Any]) -> SliceConfig:
    """A passthrough `slices:` config, checked; InvalidRequest naming the key and why."""
    if doc.get("models") not in (None, []):
        raise InvalidRequest("models: give either slices: or models:, not both (as mergekit)",
                             field="models")
    _keys(doc, _TOP_KEYS, "")
    notes: list[str] = []
    compute, out_dtype = dtypes(doc, notes)
    slices = tuple(_slice(s, f"slices[{i}]", notes) for i, s in enumerate(_list(doc["slices"],
                                                                                 "slices")))
    base = doc.get("base_model")
    if base is not None and (not isinstance(base, str) or not base.strip()):
        raise InvalidRequest("base_model: must be a model name or a local path",
                             field="base_model")
    scale = _scale(doc.get("parameters"), "parameters", notes)
    return SliceConfig(base.strip() if base else None, slices, scale, compute, out_dtype,
                       tuple(notes))


def slices_as_models(doc: dict[Any, Any]) -> tuple[dict[Any, Any], dict[str, int]]:
    """A non-passthrough `slices:` config as the `models:` config it equals, and the layer count
    each model must have for that to hold (its key -> N). One slice whose sources all take the
    layers [0, N) of their models; others are refused, naming the method."""
    method = doc.get("merge_method")
    pieces = _list(doc["slices"], "slices")
    if len(pieces) != 1:
        raise InvalidRequest(f"slices: {method} over {len(pieces)} slices is not supported: "
                             "MergePipe runs several slices (layer stacking) with merge_method: "
                             "passthrough, and another method over one slice that takes every "
                             "layer of its models", field="slices")
    piece = as_mapping(pieces[0], "slices[0]")
    _keys(piece, _SLICE_KEYS, "slices[0]")
    models, counts = [], {}
    for j, src in enumerate(_list(piece.get("sources"), "slices[0].sources")):
        key = f"slices[0].sources[{j}]"
        src = as_mapping(src, key)
        _keys(src, _SOURCE_KEYS, key)
        start, end = _range(src.get("layer_range"), f"{key}.layer_range")
        if start != 0:
            raise InvalidRequest(f"{key}.layer_range: {method} over a slice that starts at layer "
                                 f"{start} is not supported (only passthrough stacks layer "
                                 "ranges); take the layers [0, N) of every model", field=
                                 f"{key}.layer_range")
        params = as_mapping(src.get("parameters"), f"{key}.parameters")
        models.append({"model": src.get("model"), **({"parameters": params} if params else {})})
        counts[f"{key}.layer_range"] = end
    out = {k: v for k, v in doc.items() if k != "slices"}
    out["models"] = models
    # the slice's parameters come before the global ones for every model: with one slice,
    # they are the global ones
    given = as_mapping(piece.get("parameters"), "slices[0].parameters")
    if given:
        out["parameters"] = {**as_mapping(doc.get("parameters"), "parameters"), **given}
    return out, counts


def _slice(value: object, key: str, notes: list[str]) -> Slice:
    piece = as_mapping(value, key)
    _keys(piece, _SLICE_KEYS, key)
    sources = tuple(_source(s, f"{key}.sources[{j}]", notes)
                    for j, s in enumerate(_list(piece.get("sources"), f"{key}.sources")))
    if len(sources) != 1:
        raise InvalidRequest(f"{key}.sources: passthrough copies one source per slice, got "
                             f"{len(sources)} (mergekit refuses it too); merge several sources "
                             "with another merge_method", field=f"{key}.sources")
    return Slice(key, sources, _scale(piece.get("parameters"), f"{key}.parameters", notes))


def _source(value: object, key: str, notes: list[str]) -> SliceSource:
    src = as_mapping(value, key)
    _keys(src, _SOURCE_KEYS, key)
    model = src.get("model")
    if not isinstance(model, str) or not model.strip() or "+" in model:
        raise InvalidRequest(f"{key}.model: must be a local path or a registered model's path "
                             "(no +LORA adapter in a slice)", field=f"{key}.model")
    start, end = _range(src.get("layer_range"), f"{key}.layer_range")
    return SliceSource(key, model.strip(), start, end,
                       _scale(src.get("parameters"), f"{key}.parameters", notes))


def _scale(value: object, key: str, notes: list[str]) -> Setting | None:
    params = as_mapping(value, key)
    for name in sorted(set(params) - {"scale"}):
        notes.append(f"{key}.{name}: ignored: mergekit's passthrough takes only scale (it "
                     "ignores it too)")
    if params.get("scale") is None:
        return None
    return canonical(params["scale"], f"{key}.scale")


def _range(value: object, key: str) -> tuple[int, int]:
    ok = (isinstance(value, list) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
    if not ok or not 0 <= value[0] < value[1]:  # type: ignore[index]
        raise InvalidRequest(f"{key}: must be [START, END], layer indices with 0 <= START < END, "
                             f"got {value!r}", field=key)
    return int(value[0]), int(value[1])  # type: ignore[index]


def _list(value: object, key: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"{key}: must be a non-empty list", field=key)
    return value


def _keys(d: dict[str, Any], allowed: set[str], key: str) -> None:
    extra = sorted(set(map(str, d)) - allowed)
    if extra:
        where = f"{key}.{extra[0]}" if key else extra[0]
        raise InvalidRequest(f"{where}: not supported here; {key or 'a passthrough config'} "
                             f"has {', '.join(sorted(allowed))}", field=where)


@dataclass(frozen=True)
class PassthroughRequest:
    """A passthrough merge as the catalog records it (merges.request): the `slices:` config with
    every model written as its source key (a registered model's name, else its location: a
    local path, or a URL pinned to its Hub commit), and where each source is read from."""

    config: dict[str, Any]
    sources: dict[str, str]  # source key -> local path or URL read
    registered: tuple[str, ...] = ()
    seed: int = 0

    operator = PASSTHROUGH

    @property
    def slice_config(self) -> SliceConfig:
        return parse_slices(self.config)

    @property
    def base(self) -> str:
        """The donor of config.json and the side files (base_model, else the first source)."""
        return self.slice_config.donor

    @property
    def source_keys(self) -> list[str]:
        """Every source, the donor first, each once."""
        cfg = self.slice_config
        keys = [cfg.donor, *(s.sources[0].model for s in cfg.slices)]
        return list(dict.fromkeys(keys))

    @property
    def params(self) -> dict[str, Any]:
        return {"slices": self.config["slices"]}

    def to_dict(self) -> dict[str, Any]:
        """The stored form; `base` and `experts` name the sources as other merges' inputs."""
        keys = self.source_keys
        return {"operator": PASSTHROUGH, "base": keys[0],
                "experts": [{"model": k} for k in keys[1:]], "config": self.config,
                "sources": self.sources, "registered": list(self.registered), "seed": self.seed}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> PassthroughRequest:
        req = PassthroughRequest(dict(d["config"]), dict(d["sources"]),
                                 tuple(d.get("registered", ())), int(d.get("seed", 0)))
        req.slice_config  # noqa: B018 - re-validated as a stored MergeRequest is
        return req
