"""Sorts the error reports of a valgrind memcheck log (errors and definitely-lost leak
records) into: those involving resnorm (a frame or an allocation origin in the
extension), known noise of CPython and the dynamic loader (and leaks not allocated
through resnorm: CPython does not free everything at exit), and the unexplained rest.

    python tools/valgrind_errors.py LOG    prints "<ours> <known> <unexplained>", and the
                                           reports of ours and of the unexplained in full
"""
import re
import sys

OURS = re.compile(r"resnorm[/.]_|resnorm_c|\.pyx|\.pxd|\.pxi|\brn_[a-z]")
# CPython 3.11's maybe_small_long() reads the digit of a fresh int before it is set
# (origin: _PyLong_New), and memcheck then flags every use of that value, in the GC too;
# ld.so's strncmp reads whole words past the end of its strings.
KNOWN = re.compile(r"Uninitialised value was created by a heap allocation\n.*malloc.*\n"
                   r".*_PyLong_New \(longobject\.c|_dl_dst_count|_dl_dst_substitute")
LEAK = re.compile(r"[\d,]+ bytes in [\d,]+ blocks are definitely lost")
KINDS = re.compile(r"^(Invalid|Conditional jump|Use of uninitialised|Syscall param|"
                   r"Mismatched|Source and destination|Argument|"
                   r"[\d,]+ bytes in [\d,]+ blocks are definitely lost)")


def reports(text):
    """The error reports of a memcheck log, each as its lines without the ==pid== prefix."""
    block, blocks = [], []
    for line in text.splitlines() + ["==0== "]:
        m = re.match(r"==\d+== ?(.*)", line)
        if not m:
            continue
        if m.group(1):
            block.append(m.group(1))
            continue
        if block and KINDS.match(block[0]):
            blocks.append(block)
        block = []
    return blocks


def main(path):
    ours, known, unexplained = [], [], []
    for r in reports(open(path).read()):
        text = "\n".join(r)
        if OURS.search(text):
            ours.append(text)
        elif KNOWN.search(text) or LEAK.match(text):  # CPython does not free all at exit
            known.append(text)
        else:
            unexplained.append(text)
    print(len(ours), len(known), len(unexplained))
    for text in ours + unexplained:
        print(text, end="\n\n", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
