"""`mergepipe calibrate BASE --text FILE`: store a base's input-channel RMS per linear weight."""

from __future__ import annotations

import argparse
from pathlib import Path

from mergepipe.cli.main import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="measure a base's input-channel RMS on a text (utility=activation)",
        description="Run the registered base model on CPU (transformers: pip install "
                    "'mergepipe[eval]') over the first --tokens tokens of a calibration text, "
                    "tokenized with the model's own tokenizer, and store for every linear "
                    "weight the RMS of each input channel in the catalog. Plans with "
                    "--param utility=activation then rank expert blocks by their effect on "
                    "the layer outputs under these activations (the base's newest "
                    "calibration; the plan names it and its hash covers it).")
    p.add_argument("base", help="the registered base model (NAME or NAME~N)")
    p.add_argument("--text", type=Path, required=True, metavar="FILE",
                   help="calibration text (UTF-8)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="tokens to run (default 2048)")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(func=run, beside_server=True, local_paths=("text",))


def run(args: argparse.Namespace) -> int:
    from mergepipe.api import read_text
    from mergepipe.cli.beside import open_catalog

    text = read_text(args.text, "calibration text")
    with open_catalog(args) as cat:
        row = cat.calibrate(args.base, text, tokens=args.tokens)
    if args.json:
        print_json(row.to_dict())
    else:
        print(f"calibration {row.calibration_id} of {row.model}: {row.tokens} tokens "
              f"(text sha256 {row.text_sha256[:12]}); plan with --param utility=activation")
    return 0
