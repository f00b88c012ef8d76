"""mergekit's tokenizer options (tokenizer_source, tokenizer:, chat_template) against mergekit
0.1.5 on a tiny Llama family whose models carry a 64-token tokenizer built here with `tokenizers`:
the tensors bit-equal, the tokenizer files mergekit writes equal in content."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import InvalidRequest
from mergepipe.jobs.config import load_config
from tests import mergekit_parity as mp
from tests.catalogs import new_catalog
from tests.tokenizer_parity import check, configs, family, save_tokenizer, vocab

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


def test_what_would_reindex_the_embeddings_is_refused(tmp_path: Path) -> None:
    """Padding to new rows, and a union of differing vocabularies: refused naming the option."""
    fam = family(tmp_path / "fam")
    ta = mp.config("task_arithmetic", fam, "float32")
    cat = Catalog(new_catalog(tmp_path, "cat"))
    try:
        with pytest.raises(InvalidRequest, match=r"^tokenizer\.pad_to_multiple_of: 48 pads the "
                                                 "64-token vocabulary to 96 rows"):
            load_config(cat, yaml.safe_dump(
                {**ta, "tokenizer": {"source": "base", "pad_to_multiple_of": 48}}))
        save_tokenizer(fam["e2"], vocab("v"))
        with pytest.raises(InvalidRequest, match=r"^tokenizer_source: union: the vocabularies "
                                                 "differ .*'w3'"):
            load_config(cat, yaml.safe_dump({**ta, "tokenizer_source": "union"}))
    finally:
        cat.close()
