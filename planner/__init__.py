"""Access planner: which expert blocks a merge reads under an I/O budget (SQL over the catalog)."""
