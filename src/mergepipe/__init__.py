"""MergePipe: budgeted, catalog-planned merging of LLM checkpoint families."""

__version__ = "0.1.0"
