"""No measured number in the docs outside tools/doc_numbers.py: a number that looks
measured (a median with its min..max, a time, an ulp count, a ratio or percentage with
decimals, a decimal with three or more significant digits; not a whole 10x or 10%, mostly
thresholds, nor 0.5) must sit in a marker the generator
fills (`<!--n:KEY-->...<!--/n-->`, `<!-- numbers:KEY -->` blocks), in a region marked
`<!-- measured-once: WHY -->...<!-- /measured-once -->` (measured once, too costly or
machine-specific to regenerate: the reason says which), or be one of ALLOWED below, which
are not measurements.

And a sample of the generator's cheapest section, run again, agrees with the docs: within
the spread over seeds the docs report, exactly where the number does not depend on the
seeds."""
import re
import shutil
from pathlib import Path

from test_doc_numbers import doc_numbers  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent


def pages(root=ROOT):
    # accuracy.md is written whole by tools/accuracy_doc.py, and tests/test_accuracy.py
    # checks the contract it states
    return sorted(p for p in (root / "docs").glob("*.md") if p.name != "accuracy.md")


_BLANK = lambda m: re.sub(r"[^\n]", " ", m.group(0))   # keeps line numbers
HIDDEN = [
    re.compile(r"<!-- numbers:[\w.-]+ -->\n.*?<!-- /numbers -->", re.S),
    re.compile(r"<!--n:[\w.-]+-->.*?<!--/n-->", re.S),
    re.compile(r"<!-- measured-once: .*?-->.*?<!-- /measured-once -->", re.S),
    # tests/test_doc_blocks.py runs every python block: its numbers are code
    re.compile(r"^(`{3,})[ \t]*(?:python|py|python3)[ \t]*\n.*?^\1[ \t]*$", re.S | re.M),
    re.compile(r"<!--.*?-->", re.S),
    # inline code holds code, constants and values of expressions, not measurements
    re.compile(r"(?<!`)`[^`\n]+`(?!`)"),
    # versions of the tools named
    re.compile(r"\b(?:C?Python|PyTorch|GCC|valgrind|NumPy)\s+(?:>=\s*)?\d+(?:\.\d+)+"),
]
_NUM = r"(?<![\w.:/-])\d+(?:\.\d+)?"
MEASURED = re.compile("|".join([
    _NUM + r"\s*\(\s*\d+(?:\.\d+)?\s*\.\.\s*\d+(?:\.\d+)?\s*\)",      # median (min..max)
    _NUM + r"\s?(?:ns|us|µs|ms|s|seconds|min|minutes)\b",              # a time
    _NUM + r"\s?ulps?\b",                                               # 2.8 ulp
    r"(?<![\w.:/-])\d+\.\d+(?:x|%)(?!\w)",                              # 1.3x, 2.7%
    r"(?<![\w.:/-])\d+\.\d+(?:e[-+]?\d+)?(?!\w|\.\d)",                 # 2.72, 1.38e-06
]))

# Numbers that look measured and are not, each with why
ALLOWED = [
    ("architecture.md", "0.044715 x^3", "the tanh GELU's constant"),
    ("blocks.md", "4.72 M floats", "arithmetic on the shapes given before it"),
    ("blocks.md", "0.625 at T = 128", "the formula (1 + 32/T)/2 just before it"),
    ("deepnorm.md", "| alpha |", "the formula (2N)^(1/4) at the N of the header"),
    ("deepnorm.md", "| beta |", "the formula (8N)^(-1/4) at the N of the header"),
    ("explain.md", "Gated RMSNorm, gate before the norm", "the command's printed output, "
     "which tests/test_explain.py compares with this excerpt line by line"),
    ("pre_post_norm.md", "about 4.5% per layer", "a published measurement, cited"),
    ("pre_post_norm.md", "between 0.8 and 1.25", "the bounds of a claim the generator checks"),
]


def _hidden(text):
    for rx in HIDDEN:
        text = rx.sub(_BLANK, text)
    return text


def _significant(token):
    m = re.fullmatch(r"(\d+)\.(\d+)(?:e[-+]?\d+)?", token)
    return len((m[1] + m[2]).lstrip("0")) if m else None


def _fenced(text):
    """(first line, last line) of every fenced block, 1-based."""
    lines, spans, start = text.splitlines(), [], None
    for i, line in enumerate(lines, 1):
        if re.match(r"^\s*(`{3,}|~{3,})", line):
            if start is None:
                start = i
            else:
                spans.append((start, i))
                start = None
    return spans


def measured_numbers(text):
    """(line, number, the line's text) of every number of text that looks measured and
    is in no marker."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(_hidden(text).splitlines(), 1):
        for m in MEASURED.finditer(line):
            sig = _significant(m[0])
            # a bare decimal counts from three significant digits: 0.5 or 1.25 are
            # usually constants, 2.72 or 0.606 results
            if sig is None or sig >= 3:
                found.append((i, m[0], lines[i - 1]))
    return found


def allowed(page, text, hit):
    """The ALLOWED entry covering a hit: its anchor is on the hit's line or in the fenced
    block the hit is in."""
    line = hit[0]
    lines = text.splitlines()
    for entry in ALLOWED:
        if entry[0] != page:
            continue
        if entry[1] in lines[line - 1]:
            return entry
        for a, b in _fenced(text):
            if a <= line <= b and any(entry[1] in x for x in lines[a - 1:b]):
                return entry
    return None


def unexplained(root=ROOT):
    """'page:line: number' of every measured-looking number outside the generator's
    markers, the measured-once regions and ALLOWED."""
    problems = []
    for path in pages(root):
        text = path.read_text(encoding="utf-8")
        for hit in measured_numbers(text):
            if allowed(path.name, text, hit) is None:
                problems.append(f"docs/{path.name}:{hit[0]}: {hit[1]!r} in {hit[2].strip()!r}")
    return problems


def test_every_measured_number_is_generated_or_marked():
    problems = unexplained()
    assert not problems, (
        "numbers that look measured, outside tools/doc_numbers.py's markers: generate them "
        "(<!--n:KEY-->), mark a region <!-- measured-once: WHY --> ... <!-- /measured-once "
        "-->, or, if not measured, add them to ALLOWED with why:\n" + "\n".join(problems))


def test_every_allowed_entry_is_used():
    # an entry nothing needs any more would hide a measured number written there later
    used = set()
    for path in pages():
        text = path.read_text(encoding="utf-8")
        used |= {allowed(path.name, text, hit) for hit in measured_numbers(text)}
    assert [e for e in ALLOWED if e not in used] == []


def test_measured_once_regions_say_why_and_stay_off_regenerated_pages():
    for path in pages():
        text = path.read_text(encoding="utf-8")
        opens = re.findall(r"<!-- measured-once: (.*?)-->", text, re.S)
        assert len(opens) == text.count("<!-- /measured-once -->"), path.name
        assert all(len(why.split()) >= 3 for why in opens), path.name
        # these pages promise that every number on them is regenerated
        if "regenerated by\n`PYTHONPATH=src python tools/doc_numbers.py`" in text:
            assert not opens, path.name


def test_a_hand_copied_number_is_caught(tmp_path):
    (tmp_path / "docs").mkdir()
    for path in pages():
        shutil.copy(path, tmp_path / "docs" / path.name)
    assert unexplained(tmp_path) == []
    page = tmp_path / "docs" / "sandwich_norm.md"
    clean = page.read_text(encoding="utf-8")
    for planted in ("its output moved 1.2 (1.1..1.4) of its size", "one step took 3 ms",
                    "Post-LN's 0.724 nats", "1.3x the time", "within 2.8 ulp",
                    "2.7% of the values", "a held-out loss of 2.75"):
        page.write_text(clean + f"\nIn one run {planted}.\n", encoding="utf-8")
        assert [p for p in unexplained(tmp_path) if "sandwich_norm.md" in p], planted
    # the same numbers under the generator's markers, or in a marked region, pass
    page.write_text(clean + "\n<!--n:deepnorm.seeds-->1.2 (1.1..1.4)<!--/n--> and\n"
                    "<!-- measured-once: a planted example -->took 3 ms<!-- /measured-once "
                    "-->, 0.5 and 1e-5 (constants)\n", encoding="utf-8")
    assert unexplained(tmp_path) == []


# --------------------------------------------------------------------------- a sample

_RANGE = re.compile(r"(\S+) \((\S+)\.\.(\S+)\)")


def test_a_sample_of_the_demos_section_agrees_with_the_docs(doc_numbers, monkeypatch):
    """The depth and gradients demos over 3 of their 10 seeds (the same first 3: each seed
    k draws from default_rng([0, k])): every (min..max) over seeds must fall within the
    docs' range, and what does not depend on the seeds must be equal."""
    from resnorm.demos import depth, gradients
    numbers = doc_numbers.load()["values"]
    out = doc_numbers.Out()
    for module, finish in ((depth, doc_numbers._depth), (gradients, doc_numbers._gradients)):
        monkeypatch.setitem(module.SIZES, "sample", dict(module.SIZES["full"], seeds=3))
        finish(out, module.run("sample"))
    exact = ("depth.pre1.closed", "depth.pres.closed", "depth.post.norm", "grad.deep.alpha",
             "grad.deep.beta", "grad.pre1.closed", "grad.pres.closed", "grad.one_row_drift")
    for key in exact:
        assert out.values[key] == numbers[key], key
    ranges = [k for k, v in out.values.items() if _RANGE.fullmatch(v)]
    assert len(ranges) >= 10
    for key in ranges:
        _, lo, hi = map(float, _RANGE.fullmatch(out.values[key]).groups())
        _, doc_lo, doc_hi = map(float, _RANGE.fullmatch(numbers[key]).groups())
        # the same seeds, the same rounding to the printed digits: inside, ends included
        assert doc_lo <= lo <= hi <= doc_hi, (key, out.values[key], numbers[key])


def test_the_sandwich_pages_initial_branch_sizes_agree_with_the_docs(doc_numbers):
    # deterministic: the blocks' default initialisation and the inputs are seeded
    out = doc_numbers.Out()
    doc_numbers._branch_rms(out)
    numbers = doc_numbers.load()
    assert out.values == {k: v for k, v in numbers["values"].items()
                          if k.startswith("deepnorm.branch.")}
    assert out.claims == {k: v for k, v in numbers["claims"].items()
                          if k.startswith("deepnorm.branch.")}
