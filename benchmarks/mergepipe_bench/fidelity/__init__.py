"""Downstream fidelity benchmark: KL of budgeted merges of a self-trained tiny Llama family."""
