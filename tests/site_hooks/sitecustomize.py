"""Runs at the start of every Python process whose PYTHONPATH holds this folder (see
hold_hooks.child_env): installs the fault tests' hold hooks there."""

import importlib
import os

if os.environ.get("MERGEPIPE_TEST_HOLD_DIR"):  # hold_hooks.FOLDER_ENV
    importlib.import_module("hold_hooks").install_from_env()
