"""The registry of the row primitives: the one list from which everything that names them
is generated.

Each entry is one primitive of the C core (resnorm_c/*.h): its name, what it returns, its
parameters (``T`` is the element type) and the formula it computes.  A row primitive that
reads ahead takes ``ahead``, the rows that follow its row (or group of rows) in the arrays
it reads: it prefetches the next row only when there is one (0: the last row, or a row
that is not part of an array of rows).  From this list,
``generate()`` writes

* ``primitives.h``: the C tables (``rn_ops_f32``, ``rn_ops_f64``, ``rn_ops_any``) and the
  macro that fills a level's table by member name from its functions
  (``rn_<name>_<type>_<level>``, e.g. ``rn_sum_f32_avx2``; untyped ones ``rn_<name>_<level>``);
* ``primitives.pxd``: the Cython declarations of those tables and one front-end per
  primitive, ``rn_<name>(...)``, that picks the table of its element type (a fused type);
* the table of primitives in docs/architecture.md (``docs_table()``; a test keeps it in step).

Adding a primitive: one entry here, plus its C definition in the file the entry names.
Adding an element type: one entry in ELEMENT_TYPES, plus its instantiation in level.h.
setup.py runs ``generate()`` before Cython; ``python resnorm_c/primitives.py`` does too.
"""
import os
import re
from dataclasses import dataclass

# (C type, name suffix); the fused Cython type `element` covers these, in this order.  The
# 16-bit types (core/rn_half.h) are stored as 16 bits and computed in float32; the fused
# type `real` covers the types computed in themselves, float and double.
ELEMENT_TYPES = [("float", "f32"), ("double", "f64"), ("rn_bf16", "bf16"), ("rn_f16", "f16")]
HALF_TYPES = ("rn_bf16", "rn_f16")


@dataclass(frozen=True)
class Primitive:
    name: str
    returns: str
    params: str        # C parameter list; T stands for the element type
    formula: str       # what it computes, with the names the docs use
    source: str        # the header that defines it
    typed: bool = True  # False: one function for every element type (table rn_ops_any)
    halves: bool = True  # False: float and double only (front-end over the fused type real)
    mixed: bool = False  # True: the 16-bit types only, with float32 parameters (fused type half)


PRIMITIVES = [
    # ---- reductions: one row in, a float64 sum out (32 fixed lanes, reduce.h)
    Primitive("sum", "double", "const T *x, Py_ssize_t d, Py_ssize_t ahead", "sum_i x_i",
              "reduce.h"),
    Primitive("sumsq", "double", "const T *x, Py_ssize_t d, Py_ssize_t ahead", "sum_i x_i^2",
              "reduce.h"),
    Primitive("sumsqdev", "double", "const T *x, Py_ssize_t d, double mean",
              "sum_i (x_i - mean)^2", "reduce.h"),
    Primitive("shifted_sums", "void", "double *sums, const T *x, Py_ssize_t d, Py_ssize_t ahead",
              "sums = (c, sum_i (x_i - c), sum_i (x_i - c)^2);  c = mean of the first "
              "min(d, 32) x_i", "reduce.h"),
    Primitive("rms_bwd_dot", "double",
              "const T *dy, const T *x, const T *w, double rstd, Py_ssize_t d, Py_ssize_t ahead",
              "sum_i g_i xn_i;  g = dy*w, xn = x*rstd", "reduce.h"),
    Primitive("ln_bwd_sums", "void",
              "double *sum_g, double *sum_gxhat, const T *dy, const T *x, const T *w, "
              "double mean, double rstd, Py_ssize_t d, Py_ssize_t ahead",
              "sum_g = sum_i g_i, sum_gxhat = sum_i g_i xhat_i;  xhat = (x - mean)*rstd",
              "reduce.h"),
    Primitive("rms_bwd_dot_mixed", "double",
              "const T *dy, const T *x, const float *w, double rstd, Py_ssize_t d, "
              "Py_ssize_t ahead",
              "rms_bwd_dot with float32 w_i (16-bit dy and x)", "reduce.h", mixed=True),
    Primitive("ln_bwd_sums_mixed", "void",
              "double *sum_g, double *sum_gxhat, const T *dy, const T *x, const float *w, "
              "double mean, double rstd, Py_ssize_t d, Py_ssize_t ahead",
              "ln_bwd_sums with float32 w_i (16-bit dy and x)", "reduce.h", mixed=True),
    Primitive("residual_reduce", "double",
              "const T *residual, const T *x, const T *alpha, const uint8_t *keep, "
              "Py_ssize_t kpos, double scale, Py_ssize_t d, int squares, double shift, "
              "Py_ssize_t ahead",
              "sum_i (h_i - shift)^(1 + squares);  h = residual + alpha*(x*m), not stored",
              "reduce.h", halves=False),
    Primitive("residual_shifted_sums", "void",
              "double *sums, const T *residual, const T *x, const T *alpha, "
              "const uint8_t *keep, Py_ssize_t kpos, double scale, Py_ssize_t d, "
              "Py_ssize_t ahead",
              "shifted_sums of h = residual + alpha*(x*m), not stored", "reduce.h", halves=False),
    Primitive("residual_add_shifted_sums", "void",
              "double *sums, T *h, const T *residual, const T *x, const T *alpha, "
              "const uint8_t *keep, Py_ssize_t kpos, double scale, Py_ssize_t d, "
              "Py_ssize_t ahead",
              "h_i = residual_i + alpha_i*(x_i*m_i), stored;  shifted_sums of h",
              "reduce.h", halves=False),
    Primitive("residual_add_reduce", "double",
              "T *h, const T *residual, const T *x, const T *alpha, const uint8_t *keep, "
              "Py_ssize_t kpos, double scale, Py_ssize_t d, Py_ssize_t ahead",
              "h_i = residual_i + alpha_i*(x_i*m_i), stored;  sum_i h_i^2",
              "reduce.h", halves=False),
    # ---- forward elementwise passes (apply.h)
    Primitive("rms_apply", "void",
              "T *y, const T *x, const T *w, double rstd, Py_ssize_t d, int stream, "
              "Py_ssize_t ahead",
              "y_i = x_i * rstd * w_i", "apply.h"),
    Primitive("ln_apply", "void",
              "T *y, const T *x, const T *w, const T *b, double mean, double rstd, "
              "Py_ssize_t d, int stream, Py_ssize_t ahead",
              "y_i = (x_i - mean) * rstd * w_i + b_i", "apply.h"),
    Primitive("rms_apply_mixed", "void",
              "T *y, const T *x, const float *w, double rstd, Py_ssize_t d, int stream, "
              "Py_ssize_t ahead",
              "rms_apply with float32 w_i (16-bit x and y)", "apply.h", mixed=True),
    Primitive("ln_apply_mixed", "void",
              "T *y, const T *x, const float *w, const float *b, double mean, double rstd, "
              "Py_ssize_t d, int stream, Py_ssize_t ahead",
              "ln_apply with float32 w_i, b_i (16-bit x and y)", "apply.h", mixed=True),
    Primitive("residual_norm_apply", "void",
              "T *y, T *h, const T *residual, const T *x, const T *alpha, "
              "const uint8_t *keep, Py_ssize_t kpos, double scale, const T *w, const T *b, "
              "double mean, double rstd, Py_ssize_t d, int stream",
              "h_i = residual_i + alpha_i*(x_i*m_i),  y_i = (h_i - mean) * rstd * w_i + b_i",
              "apply.h", halves=False),
    # ---- backward elementwise passes over up to RN_GROUP rows (backward.h)
    Primitive("rms_bwd_apply_rows", "void",
              "T *dx, T *dx2, T *dw, double *dw_part, const T *dy, const T *dh, const T *x, "
              "const T *w, const double *rstd, const double *m, int rows, Py_ssize_t d, "
              "int stream, Py_ssize_t ahead, int prefetch_dx",
              "dx = rstd * (g - xn * m) + dh,  dx2 = dx,  dw_part += sum_rows dy*xn "
              "(or dw = that sum)", "backward.h"),
    Primitive("ln_bwd_apply_rows", "void",
              "T *dx, T *dx2, T *dw, T *db, double *dw_part, double *db_part, const T *dy, "
              "const T *dh, const T *x, const T *w, const double *mean, const double *rstd, "
              "const double *mean_g, const double *mean_gxhat, int rows, Py_ssize_t d, "
              "int stream, Py_ssize_t ahead, int prefetch_dx",
              "dx = rstd * (g - mean_g - xhat * mean_gxhat) + dh,  dx2 = dx,  "
              "dw_part += sum_rows dy*xhat,  db_part += sum_rows dy (or dw, db = those sums)",
              "backward.h"),
    Primitive("rms_bwd_apply_rows_mixed", "void",
              "T *dx, float *dw, double *dw_part, const T *dy, const T *x, const float *w, "
              "const double *rstd, const double *m, int rows, Py_ssize_t d, int stream, "
              "Py_ssize_t ahead, int prefetch_dx",
              "rms_bwd_apply_rows with float32 w_i and dw (16-bit dx, dy, x; no dx2, dh)",
              "backward.h", mixed=True),
    Primitive("ln_bwd_apply_rows_mixed", "void",
              "T *dx, float *dw, float *db, double *dw_part, double *db_part, const T *dy, "
              "const T *x, const float *w, const double *mean, const double *rstd, "
              "const double *mean_g, const double *mean_gxhat, int rows, Py_ssize_t d, "
              "int stream, Py_ssize_t ahead, int prefetch_dx",
              "ln_bwd_apply_rows with float32 w_i, dw and db (16-bit dx, dy, x; no dx2, dh)",
              "backward.h", mixed=True),
    # ---- backward elementwise passes of one row, column sums carried (backward.h)
    Primitive("rms_bwd_row_carry", "void",
              "T *dx, T *dx2, T *cw, const T *dy, const T *dh, const T *x, const T *w, "
              "double rstd, double m, Py_ssize_t d",
              "dx = rstd * (g - xn * m) + dh,  dx2 = dx,  cw += dy*xn", "backward.h",
              halves=False),
    Primitive("ln_bwd_row_carry", "void",
              "T *dx, T *dx2, T *cw, T *cb, const T *dy, const T *dh, const T *x, const T *w, "
              "double mean, double rstd, double mean_g, double mean_gxhat, Py_ssize_t d",
              "dx = rstd * (g - mean_g - xhat * mean_gxhat) + dh,  dx2 = dx,  cw += dy*xhat,  "
              "cb += dy", "backward.h", halves=False),
    Primitive("carry_flush", "void", "double *part, T *c, Py_ssize_t d",
              "part += c (widened), then c = 0", "backward.h", halves=False),
    # ---- residual connections and dropout rows (residual_rows.h)
    Primitive("residual_add", "void",
              "T *h, const T *residual, const T *x, const T *alpha, const uint8_t *keep, "
              "Py_ssize_t kpos, double scale, Py_ssize_t d, int stream, Py_ssize_t ahead",
              "h_i = residual_i + alpha_i*(x_i*m_i)", "residual_rows.h"),
    Primitive("residual_bwd", "void",
              "T *dx, T *dresidual, double *dalpha_part, const T *gh, const T *dh, const T *x, "
              "const T *alpha, const uint8_t *keep, Py_ssize_t kpos, double scale, "
              "Py_ssize_t d, int stream, Py_ssize_t ahead",
              "dresidual = gh + dh,  dx = (gh + dh)*alpha*m,  dalpha_part += (gh + dh)*(x*m)",
              "residual_rows.h"),
    # ---- sums over rows (partials.h)
    Primitive("narrow", "void", "T *out, const double *acc, Py_ssize_t d", "out_i = (T) acc_i",
              "partials.h"),
    Primitive("to_float32", "void", "float *out, const T *x, Py_ssize_t n",
              "out_i = (float) x_i", "convert.h"),
    Primitive("from_float32", "void", "T *out, const float *x, Py_ssize_t n, int stream",
              "out_i = (T) x_i, rounded to nearest even", "convert.h"),
    Primitive("accumulate", "void", "double *acc, const double *part, Py_ssize_t d",
              "acc_i += part_i", "partials.h", typed=False),
    # ---- the dropout mask (philox.h)
    Primitive("philox_uniforms", "void",
              "uint32_t *u, uint64_t seed, uint64_t start, Py_ssize_t n",
              "u_k = Philox uniform of flat element start + k", "philox.h", typed=False),
    Primitive("dropout_keep", "void",
              "uint8_t *keep, uint64_t seed, uint64_t start, Py_ssize_t n, uint32_t threshold",
              "keep_k = [uniform(start + k) >= threshold]", "philox.h", typed=False),
    Primitive("dropout_bits", "void",
              "uint64_t *words, uint64_t seed, uint64_t group, Py_ssize_t count, "
              "uint32_t threshold",
              "bit b of words_j = keep of element 64 (group + j) + b", "philox.h", typed=False),
    # ---- exp and erfc loops: the Transformer layers, the gated residual (vmath.h)
    Primitive("gelu", "void", "T *y, const T *x, Py_ssize_t n", "y = x * Phi(x)", "vmath.h", halves=False),
    Primitive("gelu_backward", "void", "T *dx, const T *dy, const T *x, Py_ssize_t n",
              "dx = dy * (Phi(x) + x phi(x))", "vmath.h", halves=False),
    Primitive("gelu_tanh", "void", "T *y, const T *x, Py_ssize_t n",
              "y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))", "vmath.h", halves=False),
    Primitive("gelu_tanh_backward", "void", "T *dx, const T *dy, const T *x, Py_ssize_t n",
              "dx = dy * d/dx gelu_tanh(x)", "vmath.h", halves=False),
    Primitive("exp_shifted", "void", "T *p, const T *s, T m, T scale, Py_ssize_t n",
              "p_j = exp(scale * (s_j - m))", "vmath.h", halves=False),
    Primitive("sigmoid", "void", "T *s, T *ds, const T *g, Py_ssize_t d",
              "s = 1/(1 + exp(-g)),  ds = s*(1 - s)", "vmath.h", halves=False),
    Primitive("gated_add", "void",
              "T *h, const T *x, const T *F, const T *g, Py_ssize_t d, int stream, "
              "Py_ssize_t ahead",
              "h_i = x_i + F_i * sigmoid(g_i)", "vmath.h"),
    Primitive("gated_bwd", "void",
              "T *dx, T *dF, T *dg, double *dg_part, const T *dh, const T *F, const T *g, "
              "Py_ssize_t d, int stream, Py_ssize_t ahead",
              "dx = dh,  dF = dh*s,  dg = F*(dh*s*(1 - s)) (or dg_part += it);  s = sigmoid(g)",
              "vmath.h"),
]

_HERE = os.path.dirname(os.path.abspath(__file__))
_NOTICE = "generated by resnorm_c/primitives.py from its PRIMITIVES list: do not edit"


def _with_type(text, ctype):
    """text with the element-type placeholder T replaced by ctype."""
    return re.sub(r"\bT\b", ctype, text)


def _param_names(params):
    return [re.split(r"[\s*]+", p.strip())[-1] for p in params.split(",")]


def _typed(ctype=None):
    """The typed primitives (of one element type: the 16-bit types lack some, and only they
    have the mixed ones)."""
    return [p for p in PRIMITIVES if p.typed and (p.halves or ctype not in HALF_TYPES)
            and (not p.mixed or ctype is None or ctype in HALF_TYPES)]


def _types_of(p):
    """The element types (C type, suffix) that typed primitive p has an instance of."""
    return [t for t in ELEMENT_TYPES if p in _typed(t[0])]


def _untyped():
    return [p for p in PRIMITIVES if not p.typed]


def c_header():
    """primitives.h: the tables of every element type, and how a level fills them."""
    lines = [f"/* {_NOTICE}. */", "#ifndef RESNORM_PRIMITIVES_H", "#define RESNORM_PRIMITIVES_H",
             "", "#include <Python.h>", "#include <stdint.h>", '#include "rn_half.h"', ""]

    def struct(name, entries, ctype):
        lines.append("typedef struct {")
        for p in entries:
            lines.append(f"    {p.returns} (*{p.name})({_with_type(p.params, ctype)});")
        lines.append(f"}} {name};")
        lines.append("")

    for ctype, ts in ELEMENT_TYPES:
        struct(f"rn_ops_{ts}", _typed(ctype), ctype)
    struct("rn_ops_any", _untyped(), "void")

    lines.append("/* A level's tables, by member name, from its functions rn_<name>_<type>_<level>")
    lines.append(" * (rn_<name>_<level> for the untyped ones).  ISA: the level's name suffix. */")
    for ctype, ts in ELEMENT_TYPES:
        inits = ", ".join(f".{p.name} = rn_{p.name}_{ts}_##ISA" for p in _typed(ctype))
        lines.append(f"#define RN_OPS_{ts.upper()}(ISA) {{{inits}}}")
    inits = ", ".join(f".{p.name} = rn_{p.name}_##ISA" for p in _untyped())
    lines.append(f"#define RN_OPS_ANY(ISA) {{{inits}}}")
    lines.append("")
    lines.append("/* All the tables of one level (level.h defines one per level; dispatch.c picks one). */")
    lines.append("typedef struct {")
    lines.append("    rn_ops_any any;")
    for _, ts in ELEMENT_TYPES:
        lines.append(f"    rn_ops_{ts} {ts};")
    lines.append("} rn_ops;")
    members = ", ".join([".any = RN_OPS_ANY(ISA)"]
                        + [f".{ts} = RN_OPS_{ts.upper()}(ISA)" for _, ts in ELEMENT_TYPES])
    lines.append(f"#define RN_LEVEL_TABLE(ISA) {{{members}}}")
    lines.append("")
    lines.append("#endif /* RESNORM_PRIMITIVES_H */")
    return "\n".join(lines) + "\n"


def cython_pxd():
    """primitives.pxd: the same tables for Cython, and a fused front-end per primitive."""
    lines = [f"# {_NOTICE}.", "from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t", "",
             "ctypedef fused element:"]
    lines += [f"    {ctype}" for ctype, _ in ELEMENT_TYPES]
    lines += ["", "ctypedef fused real:"]
    lines += [f"    {ctype}" for ctype, _ in ELEMENT_TYPES if ctype not in HALF_TYPES]
    lines += ["", "ctypedef fused half:"]
    lines += [f"    {ctype}" for ctype in HALF_TYPES]
    lines += ["", 'cdef extern from "rn_half.h" nogil:']
    for ctype in HALF_TYPES:
        lines += [f"    ctypedef struct {ctype}:", "        uint16_t bits"]
    lines += ["    float rn_bf16_to_f32(rn_bf16 h)", "    float rn_f16_to_f32(rn_f16 h)",
              "    rn_bf16 rn_f64_to_bf16(double d)", "    rn_f16 rn_f64_to_f16(double d)"]
    lines += ["", 'cdef extern from "primitives.h" nogil:']

    def struct(name, entries, ctype):
        lines.append(f"    ctypedef struct {name}:")
        for p in entries:
            lines.append(f"        {p.returns} (*{p.name})({_with_type(p.params, ctype)}) "
                         "noexcept nogil")

    for ctype, ts in ELEMENT_TYPES:
        struct(f"rn_ops_{ts}", _typed(ctype), ctype)
    struct("rn_ops_any", _untyped(), "void")
    lines.append("    ctypedef struct rn_ops:")
    lines.append("        rn_ops_any any")
    lines += [f"        rn_ops_{ts} {ts}" for _, ts in ELEMENT_TYPES]
    lines += ["", 'cdef extern from "core.h":',
              "    # this module's pointer to the dispatched tables, set by rn_import_core()",
              "    const rn_ops *RN_OPS", "    int rn_import_core() except -1", ""]
    for p in _typed():
        call = f"{p.name}({', '.join(_param_names(p.params))})"
        ret = "return " if p.returns != "void" else ""
        fused = "half" if p.mixed else "element" if p.halves else "real"
        lines.append(f"cdef inline {p.returns} rn_{p.name}({_with_type(p.params, fused)}) "
                     "noexcept nogil:")
        lines.append(f'    """{p.formula}"""')
        for k, (ctype, ts) in enumerate(_types_of(p)):
            keyword = "if" if k == 0 else "elif"
            lines.append(f"    {keyword} {fused} is {ctype}:")
            lines.append(f"        {ret}RN_OPS.{ts}.{call}")
        lines.append("")
    for p in _untyped():
        call = f"{p.name}({', '.join(_param_names(p.params))})"
        ret = "return " if p.returns != "void" else ""
        lines.append(f"cdef inline {p.returns} rn_{p.name}({p.params}) noexcept nogil:")
        lines.append(f'    """{p.formula}"""')
        lines.append(f"    {ret}RN_OPS.any.{call}")
        lines.append("")
    return "\n".join(lines)


def docs_table():
    """The Markdown table of primitives for docs/architecture.md."""
    rows = ["| primitive | computes | defined in |", "|---|---|---|"]
    for p in PRIMITIVES:
        rows.append(f"| `rn_{p.name}` | {p.formula.replace('|', '/')} | `resnorm_c/core/{p.source}` |")
    return "\n".join(rows) + "\n"


def generate(out_dir=_HERE):
    """Writes core/primitives.h and primitives.pxd under out_dir (only when they change, so
    that an unchanged registry does not make the build recompile)."""
    for name, text in ((os.path.join("core", "primitives.h"), c_header()),
                       ("primitives.pxd", cython_pxd())):
        path = os.path.join(out_dir, name)
        try:
            with open(path) as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        with open(path, "w") as f:
            f.write(text)


def update_docs(path=os.path.join(_HERE, "..", "docs", "architecture.md")):
    """Rewrites the table between the primitives markers of docs/architecture.md."""
    with open(path) as f:
        doc = f.read()
    begin, end = "<!-- primitives -->\n", "<!-- /primitives -->"
    head, rest = doc.split(begin, 1)
    with open(path, "w") as f:
        f.write(head + begin + docs_table() + end + rest.split(end, 1)[1])


if __name__ == "__main__":
    import sys
    update_docs() if "--docs" in sys.argv[1:] else generate()
