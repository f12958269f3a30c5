"""The `torch` and `extras` marks (conftest.py): README's test command runs without torch,
and CI runs the `torch` tests again with torch installed, so a test that needs torch or
transformers and is not marked would never run in CI; README's command installs the
optional packages, and CI runs the `extras` tests again with them hidden."""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import conftest

TESTS = pathlib.Path(__file__).resolve().parent


def test_every_file_that_asks_for_torch_has_marked_tests():
    # a second reading, by text: an import of torch, transformers or resnorm.torch, or a
    # check of whether one is installed
    asks = re.compile(r"""^\s*(import|from)\s+(torch|transformers|resnorm\.torch)\b"""
                      r"""|(importorskip|find_spec|installed)\(\s*["'](torch|transformers)\b""",
                      re.M)
    asking = [p for p in TESTS.glob("test_*.py") if asks.search(p.read_text(encoding="utf-8"))]
    assert len(asking) >= 10
    assert [p.name for p in asking
            if not conftest.tests_naming(p, conftest.TORCH_NAMES)] == []


def _marked(tmp_path, source):
    path = tmp_path / f"case{len(list(tmp_path.iterdir()))}.py"
    path.write_text(textwrap.dedent(source))
    return conftest.tests_naming(path, conftest.TORCH_NAMES)


def test_code_counts_and_prose_does_not(tmp_path):
    assert _marked(tmp_path, '''
        """Compares with torch."""
        # torch.nn.RMSNorm
        TORCHVISION = "torchvision"

        def test_a():
            """as torch does"""
        ''') == set()
    for shared in ('import pytest\ntorch = pytest.importorskip("torch")\n',
                   "import resnorm.torch as rt\n", "from resnorm.torch import patch\n",
                   'NAMES = ("resnorm", "torch")\n',
                   'import importlib.util\nHAS = importlib.util.find_spec("transformers")\n'):
        assert _marked(tmp_path, shared + "def test_a():\n    pass\n") is True, shared


def test_a_file_without_shared_torch_code_marks_only_its_torch_tests(tmp_path):
    assert _marked(tmp_path, '''
        import pytest

        def helper():
            return 1

        def test_plain():
            assert helper() == 1

        @pytest.mark.parametrize("package", ["transformers"])
        def test_by_parameter(package):
            pytest.importorskip(package)

        class TestGroup:
            def test_inside(self):
                torch = pytest.importorskip("torch")
        ''') == {"test_by_parameter", "TestGroup"}


def test_the_mark_is_set(request):
    # this test names torch in its own code (the marker's name)
    assert request.node.get_closest_marker("torch") is not None


def test_every_file_that_imports_an_optional_package_has_extras_tests():
    extras = "|".join(sorted(conftest.EXTRA_PACKAGES))
    asks = re.compile(rf"""^\s*(import|from)\s+({extras})\b"""
                      rf"""|importorskip\(\s*["']({extras})\b""", re.M)
    asking = [p for p in TESTS.glob("test_*.py") if asks.search(p.read_text(encoding="utf-8"))]
    assert len(asking) >= 5
    assert [p.name for p in asking
            if not conftest.tests_naming(p, conftest.EXTRA_NAMES)] == []


def test_the_optional_packages_can_be_hidden():
    # as CI runs the `extras` tests: the packages' imports fail, find_spec finds nothing,
    # and resnorm imports and runs without them
    script = textwrap.dedent("""
        import importlib.util, sys
        sys.path.insert(0, sys.argv[1])
        import conftest, resnorm, numpy as np
        for name in conftest.EXTRA_PACKAGES:
            assert importlib.util.find_spec(name) is None, name
            try:
                __import__(name)
            except ImportError:
                pass
            else:
                raise AssertionError(name)
        assert resnorm.rms_norm(np.ones((2, 3), np.float32)).shape == (2, 3)
        """)
    env = {**os.environ, "RESNORM_TESTS_WITHOUT_EXTRAS": "1"}
    proc = subprocess.run([sys.executable, "-c", script, str(TESTS)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
