"""MergePipe's benchmark suite and fidelity studies: a distribution of its own beside the
product, plugging `mergepipe bench` and `mergepipe fidelity` into the command line."""
