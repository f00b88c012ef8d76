"""Train the family: a base on generic text, then one expert per task fine-tuned from it."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from mergepipe_bench.fidelity.model import (
    ModelSize,
    TrainSpec,
    load_model,
    new_model,
    save_bf16,
    train,
)
from mergepipe_bench.fidelity.tasks import TASKS, eval_set, pretrain_ids, task_examples

FAMILY_FILE = "fidelity-family.json"
BASE_FILE = "fidelity-base.json"
EVAL_PER_TASK = 64  # examples per task for the accuracies stored with the family
HELD_OUT_PER_TASK = 1024  # eval examples per task that training never sees (covers the benchmark)


@dataclass(frozen=True)
class FamilySpec:
    """Everything that determines the trained family (its hash names the cache folder)."""

    size: ModelSize = field(default_factory=ModelSize)
    tasks: tuple[str, ...] = TASKS
    pretrain: TrainSpec = field(default_factory=lambda: TrainSpec(steps=200, batch=32, lr=3e-3))
    finetune: TrainSpec = field(default_factory=lambda: TrainSpec(steps=200, batch=32, lr=5e-4))
    seed: int = 0
    experts_per_task: int = 1  # >1: copies fine-tuned on other samples and seeds ("task-k")
    dtype: str = "bf16"  # checkpoints' dtype; "f32": the base's bf16 values stored in float32

    def expert_tasks(self) -> list[tuple[str, str, int]]:
        """(expert name, task, training seed) of every expert, in training order."""
        n = len(self.tasks)
        return [(t if self.experts_per_task == 1 else f"{t}-{k}", t, self.seed + 1 + i + n * k)
                for k in range(self.experts_per_task) for i, t in enumerate(self.tasks)]

    def key(self) -> str:
        d = {**asdict(self), "size": self.size.to_dict()}  # the Llama families' keys unchanged
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _pretrain_sampler(seed: int) -> Any:
    pool = pretrain_ids(20_000, seed)

    def sample(rng: random.Random, batch: int) -> tuple[list[list[int]], list[Any]]:
        seqs = [pool[rng.randrange(len(pool))] for _ in range(batch)]
        return seqs, [None] * batch
    return sample


def _task_sampler(task: str, seed: int, held_out: set[str]) -> Any:
    pool = task_examples(task, 20_000, seed, exclude=held_out)

    def sample(rng: random.Random, batch: int) -> tuple[list[list[int]], list[Any]]:
        exs = [pool[rng.randrange(len(pool))] for _ in range(batch)]
        return [e.ids() for e in exs], [e.answers for e in exs]
    return sample


def base_key(spec: FamilySpec) -> str:
    """Hash of what determines the base (experts with other fine-tune settings share it)."""
    fields = {"size": spec.size.to_dict(), "pretrain": asdict(spec.pretrain), "seed": spec.seed}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def build_base(spec: FamilySpec, root: Path, *, rebuild: bool = False) -> dict[str, Any]:
    """Pretrain (or reuse from root/base-<key>) the base; returns its description."""
    out = root / f"base-{base_key(spec)}"
    info_path = out / BASE_FILE
    if info_path.exists() and not rebuild:
        return dict(json.loads(info_path.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    print(f"  training base ({spec.pretrain.steps} steps)", flush=True)
    base = new_model(spec.size, spec.seed)
    log = train(base, _pretrain_sampler(spec.seed), spec.pretrain, spec.seed)
    save_bf16(base, out / "model")
    info = {"path": str(out / "model"), "train": log}
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def build_family(spec: FamilySpec, root: Path, *, rebuild: bool = False) -> dict[str, Any]:
    """Train (or reuse from root/family-<key>) the base and experts; the family description."""
    from mergepipe_bench.fidelity.evaluate import task_accuracy

    out = root / f"family-{spec.key()}"
    info_path = out / FAMILY_FILE
    if info_path.exists() and not rebuild:
        return dict(json.loads(info_path.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    base = build_base(spec, root, rebuild=rebuild)
    evals = eval_set(list(spec.tasks), EVAL_PER_TASK, spec.seed)
    base["accuracy"] = task_accuracy(load_model(Path(base["path"])), evals)
    held_out = {e.text for e in eval_set(list(spec.tasks), HELD_OUT_PER_TASK, spec.seed)}
    info: dict[str, Any] = {"spec": asdict(spec), "key": spec.key(), "path": str(out),
                            "base": base, "experts": {}}
    base_path = Path(base["path"])
    if spec.dtype != "bf16":  # the same (bf16-rounded) base values in the experts' dtype
        save_bf16(load_model(base_path), out / "base", spec.dtype)
        base_path = out / "base"
        info["base"] = {**base, "path": str(base_path)}
    for name, task, seed in spec.expert_tasks():
        print(f"  fine-tuning expert {name!r} ({spec.finetune.steps} steps)", flush=True)
        model = load_model(base_path)  # the stored (bf16-rounded) base: exact deltas
        pool_seed = spec.seed if name == task else seed  # copies sample other lines
        log = train(model, _task_sampler(task, pool_seed, held_out), spec.finetune, seed)
        save_bf16(model, out / name, spec.dtype)
        info["experts"][name] = {"path": str(out / name), "train": log, "task": task,
                                 "accuracy": task_accuracy(load_model(out / name), evals)}
    info["train_seconds"] = time.perf_counter() - t0 + base["train"]["seconds"]
    info["torch"] = torch.__version__
    info_path.write_text(json.dumps(info, indent=2) + "\n")
    return info


def expert_names(info: dict[str, Any]) -> list[str]:
    """The family's expert (task) names in training order."""
    return list(info["experts"])


__all__ = ["FamilySpec", "TASKS", "build_family", "expert_names"]
