"""Renders an explain.Explanation as text: every step, element by element, with numbers."""
import numpy as np

# A reduction over more terms than this prints its first terms, "...", and its last term.
MAX_TERMS = 8
HEAD_TERMS = 3

_MASK = ", mask: resnorm.dropout_forward(return_mask=True)"
KERNELS = {"rms": "resnorm.rms_norm_forward / rms_norm_backward",
           "layer": "resnorm.layer_norm_forward / layer_norm_backward",
           "add-rms": "resnorm.add_rms_norm_forward / add_rms_norm_backward" + _MASK,
           "add-layer": "resnorm.add_layer_norm_forward / add_layer_norm_backward" + _MASK,
           "add-rms-post": "resnorm.add_rms_norm_post_forward / add_rms_norm_post_backward"
                           + _MASK,
           "add-layer-post": "resnorm.add_layer_norm_post_forward / "
                             "add_layer_norm_post_backward" + _MASK,
           "dropout": "resnorm.dropout_forward / dropout_backward",
           "scaled": "resnorm.scaled_residual_forward / scaled_residual_backward",
           "gated": "resnorm.gated_residual_forward / gated_residual_backward",
           "gated-rms": "resnorm.gated_rms_norm_forward / gated_rms_norm_backward"}
PHASES = ("input", "forward", "backward")


def _num(v, digits):
    v = float(v)
    if v.is_integer() and abs(v) < 2.0**53:     # counters, uniforms, thresholds: exact
        return str(int(v))
    return format(v, f".{digits}g")


def _operand(v, digits):
    """A number as it appears inside an expression: negatives in parentheses."""
    text = _num(v, digits)
    return f"({text})" if text.startswith("-") else text


def _vector(a, digits):
    return "[" + ", ".join(_num(v, digits) for v in np.ravel(a)) + "]"


class _Printer:
    def __init__(self, explanation, digits):
        self.e = explanation
        self.digits = digits
        self.steps = {s.name: s for s in explanation.steps}
        self.n_rows, self.d = np.shape(self.steps["x"].value)
        self.lines = []

    def group_size(self, s):
        """The elements of each group of a per-group step (value (N, G))."""
        return self.d // np.shape(s.value)[-1]

    def at(self, name, r, i, group=None):
        """The value of step `name` that enters element (r, i) (or row r when i is None, or
        group `group` of row r)."""
        s = self.steps[name]
        v = np.asarray(s.value)
        if s.per == "element":
            return v[r, i]
        if s.per == "row":
            return v[r]
        if s.per == "group":
            return v[r, group if group is not None else i // self.group_size(s)]
        if s.per == "column":
            return v[i]
        return v

    def substitute(self, expr, r, i, group=None):
        names = [n for n in self.steps if "{" + n + "}" in expr]
        # a placeholder that is a whole parenthesised argument, round({y_exact}), has its
        # parentheses already: a negative number there takes none of its own
        return expr.format(**{n: (_num if "({" + n + "})" in expr else _operand)(
            self.at(n, r, i, group), self.digits) for n in names})

    def terms(self, step, r, i):
        """The summands of a reduction step, as text, shortened when there are many."""
        if step.per == "column":
            texts = [self.substitute(step.expr, row, i) for row in range(self.n_rows)]
        elif step.per == "scalar":
            texts = [self.substitute(step.expr, row, j) for row in range(self.n_rows)
                     for j in range(self.d)]
        elif step.per == "group":      # i is the group: its elements
            gs = self.group_size(step)
            texts = [self.substitute(step.expr, r, j) for j in range(i * gs, (i + 1) * gs)]
        else:
            texts = [self.substitute(step.expr, r, j) for j in range(self.d)]
        count = len(texts)
        if len(texts) > MAX_TERMS:
            texts = texts[:HEAD_TERMS] + ["..."] + texts[-1:]
        joined = " + ".join(texts)
        return f"({joined}) / {count}" if step.reduce == "mean" else joined

    def instance(self, step, r, i):
        """One line: the step for element i of row r (or row r, or group or column i), with
        its numbers."""
        label = step.name if i is None else f"{step.name}_{i}"
        if step.per == "group":
            value = _num(self.at(step.name, r, None, i), self.digits)
            rhs = self.terms(step, r, i) if step.reduce else \
                self.substitute(step.expr, r, None, i)
        else:
            value = _num(self.at(step.name, r, i), self.digits)
            rhs = self.terms(step, r, i) if step.reduce else self.substitute(step.expr, r, i)
        prefix = "" if step.per == "column" or self.n_rows == 1 else f"row {r}: "
        if rhs in (value, f"({value})"):     # a copy of one operand: nothing to compute
            return f"    {prefix}{label} = {value}"
        return f"    {prefix}{label} = {rhs} = {value}"

    def step(self, s):
        tag = f"[{s.source}]"
        note = f"  -- {s.note}" if s.note else ""
        self.lines.append(f"  {s.formula:<44} {tag:<12}{note}".rstrip())
        if s.per == "element":
            for r in range(self.n_rows):
                for i in range(self.d):
                    self.lines.append(self.instance(s, r, i))
        elif s.per == "row":
            for r in range(self.n_rows):
                self.lines.append(self.instance(s, r, None))
        elif s.per == "group":
            for r in range(self.n_rows):
                for k in range(np.shape(s.value)[-1]):
                    self.lines.append(self.instance(s, r, k))
        elif s.per == "column":
            for i in range(self.d):
                self.lines.append(self.instance(s, 0, i))
        else:
            self.lines.append(self.instance(s, 0, None))

    def input(self, s):
        note = f"  -- {s.note}" if s.note else ""
        if s.per == "element" and self.n_rows > 1:
            for r in range(self.n_rows):
                self.lines.append(f"  {s.name} row {r} = {_vector(s.value[r], self.digits)}")
            return
        if np.ndim(s.value):
            value = _vector(s.value, self.digits)
        elif s.value.dtype == bool:
            value = str(bool(s.value))
        else:
            value = _num(s.value, self.digits)
        self.lines.append(f"  {s.name} = {value}{note}")

    def label(self, name, per, r, i):
        """How one value of a gradient is named in a line: dx_3, row 1: dx_3, dw_3, dalpha."""
        if per == "scalar":
            return name
        if per == "column" or self.n_rows == 1:
            return f"{name}_{i}"
        return f"row {r}: {name}_{i}"

    def philox(self):
        m = self.e.philox
        if m is None:
            return
        key = m["key"]
        self.lines += ["", "dropout mask: element k -> Philox-4x32-10 block counter c and "
                       "output word w",
                       f"  key = (seed mod 2^32, seed div 2^32) = ({key[0]}, {key[1]})",
                       "  c = 16 * floor(k / 64) + k mod 16,  w = floor((k mod 64) / 16),  "
                       "u_k = word w of philox(key, (c mod 2^32, c div 2^32, 0, 0))"]
        for k, c, w, block, u in zip(m["k"], m["counter"], m["word"], m["block"], m["u"]):
            words = ", ".join(str(int(v)) for v in block)
            self.lines.append(f"    k = {k}: c = {c}, w = {w}: philox(key, ({c & 0xFFFFFFFF}, "
                              f"{c >> 32}, 0, 0)) = [{words}] -> u = {int(u)}")

    def cache(self):
        e = self.e
        if not e.cache:
            return
        self.lines += ["", "cache (what forward keeps for backward)"]
        for name, what in e.cache:
            self.lines.append(f"  {name}: {what}")
        self.lines.append(f"  why: {e.cache_why}")

    def gradient_checks(self):
        e = self.e
        if not e.gradient_checks:
            return
        from .explain import FD_LEVELS, FD_STEP
        self.lines += ["", "finite differences: every gradient, component by component "
                       "(independent of the backward formula; they differentiate the forward "
                       "kernel, which the forward checks cover)",
                       "  central differences of the float64 forward kernel at the step "
                       f"{FD_STEP:g} * spread, halved {FD_LEVELS - 1} times, "
                       "Richardson-extrapolated, of "
                       f"the loss {e.gradient_loss}; spread: sqrt(var + eps) or sqrt(ms + eps) "
                       "of the row a norm normalises, else the row's root mean square",
                       "  each component within tolerance * scale + resolution: scale = the "
                       "size of the terms it sums (itself, unless they cancel), resolution = "
                       "what the float64 loss can show over the finest step"]
        if e.kind == "gated-rms":
            self.lines.append(
                "  gated-rms: spread = sqrt(ms + eps) of the element's group, over |a_i| for x "
                "when the gate comes first; for z at most 1 (sigmoid bends over about one "
                "unit of z) and, gate first, at most sqrt(ms + eps) / (|x_i| * (|silu'(z_i)| + "
                "0.5)); each component is also allowed the kernel's rounding at the size of "
                "the numbers it is formed from (rstd * (|g_i| + |un_i| * mean |g un|), times "
                "the chain rule's factor), half its dtype's smallest subnormal, and the "
                "truncation error of the finite difference (its last two Richardson levels)")
        for c in e.gradient_checks:
            mark = "ok" if c.agree else "DIFFERENT"
            self.lines.append(f"  {c.name} (with respect to {c.wrt}): worst |kernel - finite "
                              f"difference| / its tolerance = {c.worst:.3g}   (tolerance "
                              f"{c.tolerance:.3g} relative)  {mark}")
            per = self.steps[c.name].per
            for idx in np.ndindex(c.kernel.shape):
                r, i = (idx + (0, 0))[:2] if per == "element" else (0, idx[0] if idx else 0)
                label = self.label(c.name, per, r, i)
                diff = abs(c.kernel[idx] - c.finite_difference[idx])
                self.lines.append(f"    {label}: kernel {_num(c.kernel[idx], self.digits)}   "
                                  f"finite difference {_num(c.finite_difference[idx], self.digits)}"
                                  f"   |diff| {diff:.2g} <= {c.allowed[idx]:.2g}"
                                  + ("" if diff <= c.allowed[idx] else "  DIFFERENT"))

    def jacobians(self):
        e = self.e
        if not e.jacobians:
            return
        j0 = e.jacobians[0]
        self.lines += ["", f"Jacobian d{j0.of}/d{j0.wrt} of each row (closed form from the "
                       f"reference statistics): {j0.formula}",
                       "  (the closed form follows the backward's derivation: its agreement with "
                       "finite differences is independent of it, J^T dy against the gradient is "
                       "not)"]
        for j in e.jacobians:
            prefix = "" if self.n_rows == 1 else f"row {j.row}: "
            self.lines.append(f"  {prefix}J =")
            for row in j.closed_form:
                self.lines.append("    [" + ", ".join(f"{v:>11.{min(self.digits, 6)}g}"
                                                     for v in row) + "]")
            mark = "ok" if j.agree else "DIFFERENT"
            through = "dx" if j.wrt == "x" else "the kernel's gradient through the norm"
            self.lines.append(f"  {prefix}finite differences of the forward kernel: max |J - "
                              f"J_fd| = {j.max_abs_diff_fd:.3g};  J^T dy against {through}: "
                              f"max diff {j.max_abs_diff_backward:.3g}   (tolerance "
                              f"{j.tolerance:.3g})  {mark}")

    def invariant_lines(self, invariants, formula):
        """Each invariant: its formula, whether it is independent of `formula` (the
        kernel's or the backward's), why it holds, and its value in each row or group."""
        for inv in invariants:
            said = "independent" if inv.independent else "NOT independent"
            self.lines.append(f"  {inv.formula}  [{said} of {formula}]  -- {inv.note}")
            # one value per row, or per group of each row (N, G)
            values, exact = np.asarray(inv.value), np.asarray(inv.exact)
            for idx in np.ndindex(values.shape):
                r = idx[0]
                where = ([] if self.n_rows == 1 else [f"row {r}"]) + \
                    ([f"group {idx[1]}"] if len(idx) == 2 else [])
                prefix = ", ".join(where) + ": " if where else ""
                v, x = values[idx], exact[idx]
                mark = "ok" if abs(v - x) <= inv.tolerance else "DIFFERENT"
                self.lines.append(f"    {prefix}{inv.name} = {v:.3g}   (exact arithmetic: "
                                  f"{x:.3g}, tolerance {inv.tolerance:.2g})  {mark}")

    def forward_invariants(self):
        e = self.e
        if not e.forward_invariants:
            return
        self.lines += ["", "invariants of the forward: properties any correct kernel's "
                       "output has, checked on this kernel's outputs; the expectations come from "
                       "the inputs (and eps, or dropout's keep-mask), never from the kernel's "
                       "steps or the reference"]
        self.invariant_lines(e.forward_invariants, "the kernel's formula")

    def invariants(self):
        e = self.e
        if not e.invariants:
            return
        self.lines += ["", "invariants of the gradient through the norm: properties of any "
                       "correct gradient"]
        self.invariant_lines(e.invariants, "the backward formula")

    def checks(self):
        e = self.e
        self.lines.append("kernel vs reference (resnorm.reference, float64 NumPy): the same "
                          "formulas coded twice, not independent of the kernel's formula")
        for c in e.checks:
            mark = "ok" if c.agree else "DIFFERENT"
            self.lines.append(f"  {c.name:<9} max |kernel - reference| = {c.max_abs_diff:.3g}"
                              f"   (tolerance {c.tolerance:.3g})  {mark}")
        from .explain import tolerance_rule
        self.lines.append(f"  tolerance = {tolerance_rule(e.dtype, e.param_dtype)}")
        extra = (", the forward invariants hold" if e.forward_invariants else "") + \
            (", every gradient matches finite differences" if e.gradient_checks else "") + \
            (", the Jacobians and invariants hold" if e.jacobians or e.invariants else "")
        verdict = (f"AGREE: the kernel outputs match the reference{extra}" if e.agree else
                   "DISAGREE: at least one kernel output differs from the reference, or a "
                   "forward invariant fails, or a gradient differs from finite differences, "
                   "or a Jacobian or invariant fails")
        self.lines.append(f"  verdict: {verdict}")

    def render(self):
        from .explain import KIND_TITLES
        e = self.e
        rows = "1 row" if self.n_rows == 1 else f"{self.n_rows} rows"
        eps = "" if e.eps is None else f", eps = {_num(e.eps, self.digits)}"
        dtypes = e.dtype.name + ("" if e.param_dtype is None else
                                 f", {e.param_dtype.name} parameters")
        title, groups = KIND_TITLES[e.kind], ""
        if e.kind == "gated-rms":
            before = bool(self.steps["norm_before_gate"].value)
            title += (", no gate" if "z" not in self.steps else
                      ", norm before the gate" if before else ", gate before the norm")
            gs = int(self.steps["group_size"].value)
            groups = "" if gs == self.d else f" in groups of {gs}"
        self.lines.append(f"{title} ({dtypes}), {rows} of D = {self.d}{groups}{eps}")
        self.lines.append(f"outputs from the compiled kernels ({KERNELS[e.kind]}); "
                          "intermediates from float64 NumPy (resnorm.reference)")
        for phase in PHASES:
            steps = [s for s in e.steps if s.phase == phase]
            if not steps:
                continue
            self.lines.append("")
            self.lines.append("inputs" if phase == "input" else phase)
            for s in steps:
                self.input(s) if phase == "input" else self.step(s)
            if phase == "input":
                self.philox()
        self.cache()
        self.forward_invariants()
        self.gradient_checks()
        self.jacobians()
        self.invariants()
        self.lines.append("")
        self.checks()
        return "\n".join(self.lines)


def render(explanation, digits=None):
    """The explanation as text.  digits: significant digits (default 6 for float16 and
    bfloat16, 8 for float32, 10 for float64)."""
    if digits is None:
        digits = {2: 6, 4: 8}.get(explanation.dtype.itemsize, 10)
    return _Printer(explanation, digits).render()
