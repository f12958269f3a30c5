"""What a user finds in the package besides the kernels: the version, the license, type
information and the input-check reference, from an installed package as from a checkout."""
import fnmatch
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest

import resnorm

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "resnorm", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=120)


def test_version_flag():
    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"resnorm {resnorm.__version__}"


def test_version_is_a_release_number():
    parts = resnorm.__version__.split(".")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), resnorm.__version__


def test_checks_command_prints_the_reference():
    proc = run_cli("checks")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# Input checks of the public API")
    assert "TypeError" in proc.stdout and "ValueError" in proc.stdout


def test_checks_command_cites_only_what_an_installed_package_has():
    proc = run_cli("checks")
    assert proc.returncode == 0, proc.stderr
    for cited in ("tests/", "tools/", "benchmarks/", "resnorm_c/", "src/", "docs/",
                  "`test_"):
        assert cited not in proc.stdout, cited
    # nothing else is lost: every check of the table is printed
    doc = files("resnorm").joinpath("input-checks.md").read_text(encoding="utf-8")
    ids = [line.split("|")[1].strip() for line in doc.splitlines()
           if line.startswith("| `")]
    assert len(ids) > 30
    for check in ids:
        assert f"| {check} |" in proc.stdout, check
    assert "tested in the project's tests" in proc.stdout


def test_packaged_reference_is_the_documented_one():
    """The package's copy is docs/input-checks.md itself (a link), not a second text."""
    doc = ROOT / "docs" / "input-checks.md"
    if not doc.exists():
        pytest.skip("not run from a checkout: docs/ is not here")
    packaged = files("resnorm").joinpath("input-checks.md").read_text(encoding="utf-8")
    assert packaged == doc.read_text(encoding="utf-8")


def test_typed_marker_is_shipped():
    assert files("resnorm").joinpath("py.typed").is_file()


def test_license_is_mit():
    license_file = ROOT / "LICENSE"
    if not license_file.exists():
        pytest.skip("not run from a checkout: LICENSE is not here")
    text = license_file.read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "resnorm contributors" in text


def test_metadata_declares_mit_and_one_version():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not run from a checkout: pyproject.toml is not here")
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    meta = project["project"]
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]
    # the version is written once, in resnorm/__init__.py
    assert "version" not in meta and "version" in meta["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "resnorm.__version__"}
    shipped = set(project["tool"]["setuptools"]["package-data"]["resnorm"])
    assert {"py.typed", "input-checks.md"} <= shipped


def test_classifiers_name_only_tested_systems():
    """Linux is where the tests and benchmarks run; no other operating system is claimed."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")
    pyproject = ROOT / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("not run from a checkout: pyproject.toml is not here")
    classifiers = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["classifiers"]
    systems = [c for c in classifiers if c.startswith("Operating System ::")]
    assert systems == ["Operating System :: POSIX :: Linux"]


def test_source_distribution_carries_every_build_input():
    """Every tracked file under resnorm_c/ (what setup.py compiles, includes or runs to
    generate the core's tables) matches a MANIFEST.in pattern or is a listed C source, so
    that a wheel built from the sdist finds it (tools/check_wheel.sh builds one, slowly)."""
    manifest = ROOT / "MANIFEST.in"
    if not (ROOT / ".git").exists() or not manifest.exists():
        pytest.skip("not run from a git checkout")
    tracked = subprocess.run(["git", "ls-files", "resnorm_c"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    patterns = [line.split()[2:] for line in manifest.read_text(encoding="utf-8").splitlines()
                if line.startswith("recursive-include resnorm_c ")]
    patterns = [p for group in patterns for p in group]
    setup_text = (ROOT / "setup.py").read_text(encoding="utf-8")
    missing = [path for path in tracked
               if not any(fnmatch.fnmatch(Path(path).name, p) for p in patterns)
               and not (path.startswith("resnorm_c/core/") and path.endswith(".c")
                        and Path(path).stem in setup_text)]
    assert tracked and not missing, missing
