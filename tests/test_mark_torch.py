"""The `torch` mark (conftest.py): README's test command runs without torch, and CI runs the
marked tests again with torch installed, so a test that needs torch or transformers and
is not marked would never run in CI."""
import pathlib
import re
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
    assert [p.name for p in asking if not conftest.torch_tests(p)] == []


def _marked(tmp_path, source):
    path = tmp_path / f"case{len(list(tmp_path.iterdir()))}.py"
    path.write_text(textwrap.dedent(source))
    return conftest.torch_tests(path)


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
