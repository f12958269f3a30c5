"""Every step of a LayerNorm forward and backward on a small row (explain mode).

resnorm.explain runs the compiled kernel on the input given and returns every intermediate
value with the numbers filled in: the outputs are the kernel's, the intermediates come from
the float64 reference formulas.  It checks the kernel's outputs against resnorm.reference
and its gradients against finite differences.  print(e) shows what
`python -m resnorm explain layer --x 1,2,3,4 --weight 1,1,2,2 --bias 0,0,0,0.5 --dy 1,0,0,-1`
prints.
"""
import resnorm

e = resnorm.explain("layer", [1.0, 2.0, 3.0, 4.0], weight=[1.0, 1.0, 2.0, 2.0],
                    bias=[0.0, 0.0, 0.0, 0.5], dy=[1.0, 0.0, 0.0, -1.0])
print(e)

# each step is also a value to compute with: one row per input row
print("steps:", ", ".join(e.names))
print("mean:", e["mean"], "rstd:", e["rstd"], "dx:", e["dx"])
print("gradients checked by finite differences:", [c.name for c in e.gradient_checks])
assert e.agree, "a kernel output differs from its reference"
