"""The teaching docs carry exactly the numbers of the last run of tools/doc_numbers.py
(tools/doc_numbers.json), and every claim they mark held in that run.  Nothing is measured
here: regenerate with `PYTHONPATH=src python tools/doc_numbers.py` (see its docstring)."""
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def doc_numbers():
    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "tools" / "doc_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_match_the_last_run(doc_numbers):
    problems = doc_numbers.check()
    assert not problems, "\n".join(problems)


def test_every_claim_held_and_every_marker_is_known(doc_numbers):
    numbers = doc_numbers.load()
    assert numbers["claims"] and all(c["holds"] for c in numbers["claims"].values()), [
        k for k, c in numbers["claims"].items() if not c["holds"]]
    for doc in doc_numbers.DOCS:
        text = (ROOT / doc).read_text()
        for key in doc_numbers.CLAIM.findall(text):
            assert key in numbers["claims"], (doc, key)
        for m in doc_numbers.BLOCK.finditer(text):
            assert m.group(2) in numbers["blocks"], (doc, m.group(2))
        for m in doc_numbers.VALUE.finditer(text):
            assert m.group(2) in numbers["values"], (doc, m.group(2))


def _copy_docs(doc_numbers, tmp_path):
    for doc in doc_numbers.DOCS:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)


def test_a_stale_number_or_a_failed_claim_is_caught(doc_numbers, tmp_path):
    numbers = doc_numbers.load()
    _copy_docs(doc_numbers, tmp_path)
    assert doc_numbers.check(numbers, tmp_path) == []
    # a value edited by hand in a doc
    key, value = next(iter(sorted(numbers["values"].items())))
    stale = json.loads(json.dumps(numbers))
    stale["values"][key] = value + "0"
    assert any("numbers differ" in p for p in doc_numbers.check(stale, tmp_path))
    # a block that changed since the docs were written
    block = next(k for k in numbers["blocks"] if k.startswith("demo."))
    stale = json.loads(json.dumps(numbers))
    stale["blocks"][block] += "one more line\n"
    assert any("numbers differ" in p for p in doc_numbers.check(stale, tmp_path))
    # a claim that did not hold
    claim = next(iter(numbers["claims"]))
    failed = json.loads(json.dumps(numbers))
    failed["claims"][claim]["holds"] = False
    assert any("did not hold" in p for p in doc_numbers.check(failed, tmp_path))
    # a marker without an entry
    doc = tmp_path / "docs" / "rms_norm.md"
    doc.write_text(doc.read_text() + "\n<!--n:no.such.key-->1<!--/n-->\n")
    assert any("no.such.key" in p for p in doc_numbers.check(numbers, tmp_path))


def test_every_entry_belongs_to_exactly_one_section(doc_numbers):
    # `--only warmup deepnorm` replaces what those sections own and keeps the rest: that is
    # only sound when every entry of the JSON is owned by one section, and by one only
    numbers = doc_numbers.load()
    assert {"warmup", "deepnorm"} <= set(doc_numbers.SECTIONS) == set(doc_numbers.OWNERS)
    for kind in ("blocks", "values", "claims"):
        for key in numbers[kind]:
            owners = [s for s in doc_numbers.SECTIONS if doc_numbers._owned(key, s)]
            assert len(owners) == 1, (kind, key, owners)
    for section in ("warmup", "deepnorm"):
        assert f"{section}.output" in numbers["blocks"]
        assert numbers["claims"][f"{section}.ran"]["holds"]
    assert "convergence" in doc_numbers.SECTIONS and "conv.output" in numbers["blocks"]
    assert numbers["claims"]["conv.ran"]["holds"]


def test_convergence_counts_agree_with_the_demo_output(doc_numbers):
    # the seed counts quoted in docs/demos.md, the summary table and the demo's printed
    # verdicts are three renderings of one run: they must agree
    numbers = doc_numbers.load()
    output, summary = numbers["blocks"]["conv.output"], numbers["blocks"]["conv.summary"]
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:]
            for line in summary.splitlines()[2:]}
    claims = dict(doc_numbers.CONV_CLAIMS)
    for column, task in enumerate(("synthetic", "sunspots")):
        seeds = numbers["values"]["conv.seeds"]
        for key in doc_numbers.CONV_COUNTED:
            quoted = numbers["values"].get(f"conv.{task}.{key}")
            if quoted is not None:
                assert rows[claims[key]][column] == f"{quoted} seeds", (task, key)
                assert quoted.endswith(f" of {seeds}")
        verdicts = re.findall(rf"^- {task}[,:].*?: holds in (\d+ of \d+) seeds", output, re.M)
        assert len(verdicts) >= 10 and all(v.endswith(f" of {seeds}") for v in verdicts)
        quoted = numbers["values"][f"conv.{task}.tuned_final_down"]
        assert (f"- {task}, each beta at its own best lr: the absolute loss decreases with "
                f"beta: holds in {quoted} seeds") in output
