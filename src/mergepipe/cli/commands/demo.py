"""`mergepipe demo` (the README's main job, end to end) and `mergepipe gen-family OUT`."""

from __future__ import annotations

import argparse
from pathlib import Path

from mergepipe.cli.main import print_json
from mergepipe.cli.table import human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate a family, serve, merge on a budget, report")
    p.add_argument("--dir", default="demo-output", help="folder for everything the demo makes "
                   "(default: ./demo-output; replaced if it exists)")
    p.set_defaults(func=run)

    p = sub.add_parser(
        "gen-family", help="generate a synthetic checkpoint family for tests and benchmarks",
        description="Write OUT/base and OUT/expert-NN as HF LlamaForCausalLM checkpoint "
        "directories with realistically structured fine-tune deltas, plus OUT/family.json.")
    p.add_argument("out", metavar="OUT", help="directory to create")
    p.add_argument("--experts", type=int, default=4, help="number of experts K (default 4)")
    p.add_argument("--size-mb", type=float, default=200.0,
                   help="approximate size of each checkpoint in MB (default 200)")
    p.add_argument("--dtype", default="bf16", help="bf16 (default), fp16 or fp32")
    p.add_argument("--shards", type=int, default=1,
                   help="safetensors files per checkpoint (> 1 writes an index; default 1)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--lora-experts", type=int, default=0, metavar="M",
                   help="how many experts are LoRA-like: delta only in q/v projections, low rank")
    p.add_argument("--json", action="store_true", help="print family.json")
    p.set_defaults(func=run_gen_family)


def run(args: argparse.Namespace) -> int:
    from mergepipe.cli.demo import run_demo

    return run_demo(Path(args.dir).absolute())


def run_gen_family(args: argparse.Namespace) -> int:
    from mergepipe.cli.family import generate_family, read_family
    from mergepipe.core.errors import InvalidRequest

    if args.experts < 1 or args.shards < 1 or args.size_mb <= 0:
        raise InvalidRequest("--experts and --shards must be >= 1 and --size-mb > 0")
    try:
        generate_family(args.out, experts=args.experts, size_mb=args.size_mb, dtype=args.dtype,
                        shards=args.shards, seed=args.seed, lora_experts=args.lora_experts)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    info = read_family(args.out)
    if args.json:
        print_json(info)
        return 0
    n = 1 + len(info["experts"])
    lora = sum(e["lora_like"] for e in info["experts"])
    s = info["shape"]
    print(f"wrote {n} checkpoints of {human_bytes(info['checkpoint_bytes'])} "
          f"({info['dtype']}, {info['shards']} shard(s)) to {args.out} in {info['seconds']:.1f} s")
    print(f"shape: hidden {s['hidden']}, {s['layers']} layers, intermediate "
          f"{s['intermediate']}, vocab {s['vocab']}; {lora} of {n - 1} experts LoRA-like")
    return 0
