"""`mergepipe compare A B --text FILE`: teacher-forced KL(A || B) and perplexities on a text."""

from __future__ import annotations

import argparse
from pathlib import Path

from mergepipe.cli.main import print_json

DEFAULT_TOKENS = 2048  # evaluation.compare.DEFAULT_TOKENS (not imported on --help's path)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="KL(A || B) and perplexities of two registered models on a text",
        description="Run two registered full models (transformers, CPU: the 'eval' extra) on "
                    "the same text, teacher-forced, and report the mean KL(A || B) of their "
                    "next-token distributions per token and each model's perplexity: e.g. a "
                    "budgeted merge (B) against the full merge (A) before deploying it.")
    p.add_argument("model_a", metavar="A", help="a registered model (name or name~N)")
    p.add_argument("model_b", metavar="B", help="a registered model of the same vocabulary")
    p.add_argument("--text", required=True, type=Path, metavar="FILE",
                   help="a UTF-8 text file to read")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, metavar="N",
                   help=f"read at most the first N tokens of the text (default {DEFAULT_TOKENS})")
    p.add_argument("--tokenizer", metavar="MODEL",
                   help="the registered model whose tokenizer to use (default: A's, else B's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run, beside_server=True, local_paths=("text",))


def run(args: argparse.Namespace) -> int:
    from mergepipe.api import read_text
    from mergepipe.cli.beside import open_catalog

    text = read_text(args.text, "text")
    with open_catalog(args) as cat:
        r = cat.compare(args.model_a, args.model_b, text, tokens=args.tokens,
                        tokenizer=args.tokenizer)
    if args.json:
        print_json(r.to_dict())
        return 0
    print(f"compare {r.model_a!r} (A) with {r.model_b!r} (B) on {r.tokens} tokens "
          f"(tokenizer of {r.tokenizer!r}; {r.positions} predictions in {r.windows} window(s) "
          f"of at most {r.context})")
    print(f"  KL(A || B)      {r.kl:.6g} nats per token")
    print(f"  perplexity A    {r.perplexity_a:.6g}")
    print(f"  perplexity B    {r.perplexity_b:.6g}")
    print(f"  time            {r.seconds:.2f} s")
    return 0
