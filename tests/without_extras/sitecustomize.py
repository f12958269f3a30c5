"""Hides resnorm's optional packages (the extras half, plot, demos, threads and bench) when
RESNORM_TESTS_WITHOUT_EXTRAS is set: a None in sys.modules makes their import fail and
importlib.util.find_spec return None, as on a machine without them.

README's test command installs them; CI runs the tests marked `extras` again with them
hidden (RESNORM_TESTS_WITHOUT_EXTRAS=1 python -m pytest -m extras).  tests/conftest.py
imports this module, and puts its folder on PYTHONPATH, so that Python runs it at the start
of every subprocess of the suite too (the CLI tests)."""
import os
import sys

EXTRA_PACKAGES = frozenset({"matplotlib", "ml_dtypes", "numba", "onnx", "onnxruntime",
                            "statsmodels", "threadpoolctl"})

if os.environ.get("RESNORM_TESTS_WITHOUT_EXTRAS"):
    for _name in EXTRA_PACKAGES:
        sys.modules[_name] = None
