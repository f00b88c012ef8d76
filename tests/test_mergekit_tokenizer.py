"""mergekit's tokenizer options (tokenizer_source, tokenizer:, chat_template) against mergekit
0.1.5 on a tiny Llama family whose models carry a 64-token tokenizer built here with `tokenizers`:
the tensors bit-equal, the tokenizer files mergekit writes equal in content."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import mergekit_parity as mp
from tests.tokenizer_parity import check, configs, family

pytest.importorskip("mergekit")


# The quick default variant runs in tests/test_mergekit_slices.py, in one mergekit run with the
# slice configs.
@pytest.mark.slow
def test_tokenizer_options_equal_mergekit_all(tmp_path: Path) -> None:
    """An inline chat template over the base's tokenizer, another model's tokenizer, a padded
    union and `chat_template: auto`: the same tensors, tokenizer.json, tokenizer_config.json and
    chat_template.jinja as mergekit."""
    fam = family(tmp_path / "fam")
    cfgs = configs(fam)
    check(cfgs, mp.run_mergekit(cfgs, tmp_path), tmp_path)
