"""tools/valgrind_smoke.py's parts: tools/valgrind.sh runs one at each of two SIMD levels,
so between them they must make every call of the whole workout that does not depend on
the level."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SMOKE = Path(__file__).resolve().parents[1] / "tools" / "valgrind_smoke.py"
pytestmark = pytest.mark.skipif(not SMOKE.exists(), reason="needs the source checkout")


def _parts():
    spec = importlib.util.spec_from_file_location("valgrind_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PARTS


def test_the_two_parts_cover_the_whole_workout():
    parts = _parts()
    whole, threads, layouts = parts["all"], parts["threads"], parts["layouts"]
    assert len(whole) == len(threads) == len(layouts)
    for (forced, nts, with_layouts), a, b in zip(whole, threads, layouts):
        assert forced == a[0] == b[0]
        assert set(a[1]) | set(b[1]) == set(nts)            # every thread count somewhere
        assert (a[2] or b[2]) == with_layouts                 # the layouts somewhere
        assert not (a[2] and b[2]) or not forced              # ... once where forced
    assert threads != layouts


def test_an_unknown_part_is_refused():
    run = subprocess.run([sys.executable, str(SMOKE), "--part=some"], capture_output=True,
                         text=True)
    assert run.returncode == 2
    assert "invalid choice: 'some'" in run.stderr
