"""The fused block kernels (src/mergepipe/core/_fused.c), compiled when the package is installed.

-ffp-contract=off: no fused multiply-add, so every float operation rounds as torch's do.
optional: where no C compiler exists the package still installs and the executor uses the
torch kernels (slower, same bytes).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "mergepipe.core._fused", ["src/mergepipe/core/_fused.c"],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c11"],
    optional=True)])
