"""The tiny byte-level LM (Llama, or GPT-NeoX for the sixth family): its configuration, batching
and a plain training loop."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mergepipe_bench.fidelity.tasks import BOS, END, PAD, VOCAB_SIZE

ARCHS = ("llama", "gpt_neox")


@dataclass(frozen=True)
class ModelSize:
    """Dimensions and class of the tiny model (vocab is the byte-level one of tasks.py).
    arch "llama": LlamaForCausalLM (RMSNorm, SwiGLU MLP, separate q/k/v projections, no
    biases); "gpt_neox": GPTNeoXForCausalLM (LayerNorm with biases, fused query_key_value with
    bias, GELU MLP, parallel residual, rotary on a quarter of each head: GPT-NeoX's default)."""

    hidden: int = 256
    intermediate: int = 512
    layers: int = 4
    heads: int = 4
    max_len: int = 64
    arch: str = "llama"

    def config(self) -> Any:
        if self.arch == "gpt_neox":
            from transformers import GPTNeoXConfig
            return GPTNeoXConfig(
                vocab_size=VOCAB_SIZE, hidden_size=self.hidden,
                intermediate_size=self.intermediate, num_hidden_layers=self.layers,
                num_attention_heads=self.heads, max_position_embeddings=self.max_len,
                use_parallel_residual=True, hidden_act="gelu",
                layer_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=BOS,
                eos_token_id=END, pad_token_id=PAD)
        if self.arch != "llama":
            raise ValueError(f"ModelSize.arch: {self.arch!r} is not one of {ARCHS}")
        from transformers import LlamaConfig
        return LlamaConfig(
            vocab_size=VOCAB_SIZE, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.heads, max_position_embeddings=self.max_len,
            rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=END,
            pad_token_id=PAD)

    def to_dict(self) -> dict[str, Any]:
        """The fields that name the model in cache keys: arch only when not "llama", so the
        Llama families keep the keys (and cached folders) they had before arch existed."""
        d = asdict(self)
        if d["arch"] == "llama":
            del d["arch"]
        return d


@dataclass(frozen=True)
class TrainSpec:
    """One training run: steps, batch, peak learning rate (linear warmup, cosine decay)."""

    steps: int
    batch: int
    lr: float
    warmup: int = 20


def quiet_transformers() -> None:
    """No progress bars or advisory warnings from transformers in benchmark logs."""
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()


def new_model(size: ModelSize, seed: int) -> Any:
    """A freshly initialized causal LM of size.arch (float32) from a fixed seed."""
    from transformers import AutoModelForCausalLM
    quiet_transformers()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(size.config())


def load_model(path: Path) -> Any:
    """A saved checkpoint (its config names the class) as a float32 model in eval mode."""
    from transformers import AutoModelForCausalLM
    quiet_transformers()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def save_bf16(model: Any, path: Path, dtype: str = "bf16") -> None:
    """Save a bf16 (or, with dtype="f32", float32) copy of the model as safetensors (the
    training copy stays float32). float32 keeps fine-tune deltas of 1e-3 of the weights, which
    bf16's 8-bit mantissa would round away."""
    to, name = (torch.float32, "float32") if dtype == "f32" else (torch.bfloat16, "bfloat16")
    state = {k: v.detach().to(to).contiguous() for k, v in model.state_dict().items()}
    model.save_pretrained(path, state_dict=state, safe_serialization=True)
    cfg_path = path / "config.json"
    import json
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = cfg["dtype"] = name
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def collate(seqs: list[list[int]], scored: list[tuple[int, ...] | None]
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and labels: the token at the scored indexes (None: every token
    after BOS), -100 elsewhere."""
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), PAD, dtype=torch.long)
    labels = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, (s, idx) in enumerate(zip(seqs, scored, strict=True)):
        ids[i, :len(s)] = torch.tensor(s)
        keep = torch.tensor(idx) if idx is not None else torch.arange(1, len(s))
        labels[i, keep] = ids[i, keep]
    return ids, labels


def next_token_loss(model: Any, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of labels[:, 1:] given ids[:, :-1]."""
    logits = model(input_ids=ids, attention_mask=(ids != PAD).long()).logits[:, :-1]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def train(model: Any, sample: Any, spec: TrainSpec, seed: int, log_every: int = 50
          ) -> dict[str, float]:
    """Train on batches from sample(rng, batch) -> (seqs, scored); returns loss and time."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < spec.warmup:
            return spec.lr * (step + 1) / spec.warmup
        frac = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
        return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    t0 = time.perf_counter()
    ema = None
    for step in range(spec.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, labels = collate(*sample(rng, spec.batch))
        loss = next_token_loss(model, ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
        if log_every and (step + 1) % log_every == 0:
            print(f"    step {step + 1}/{spec.steps} loss {ema:.3f} "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
    model.eval()
    return {"final_loss": float(ema or 0.0), "seconds": time.perf_counter() - t0}
