"""Derives the polynomial coefficients of resnorm_c/core/vmath.h and reports their accuracy.

    python tools/fit_vmath.py

exp:  exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2, q a degree-4 Chebyshev least-squares fit.
erfc: erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2), z in [0, 9], P of degree 9.
Both fits are done in float64 on Chebyshev nodes; the coefficients are then rounded to
float32 and the float32 evaluation (emulated with NumPy float32 arithmetic, the same
operations in the same order as the C code) is compared with float64 exp / scipy's erfc.
"""
import numpy as np
from numpy.polynomial import chebyshev as C
from scipy.special import erfc

F = np.float32


def nodes(a, b, n=4000):
    k = np.arange(n)
    return (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (k + 0.5) / n)


def fit(x, y, deg):
    """Monomial coefficients, lowest first, of the Chebyshev least-squares fit."""
    return C.cheb2poly(C.chebfit(x, y, deg)).astype(F)


def horner(coef, x):
    acc = np.zeros_like(x)
    for a in coef[::-1]:
        acc = acc * x + a
    return acc


HALF_LN2 = np.log(2) / 2
r = nodes(-HALF_LN2, HALF_LN2)
EXP_Q = fit(r, (np.expm1(r) - r) / r**2, 4)

T_MIN = 1 / (1 + 9 / 2)
t = nodes(T_MIN, 1.0)
z = 2 * (1 / t - 1)
ERFC_P = fit(t, np.log(erfc(z) / t) + z * z, 9)


def expf(x):
    x = np.clip(x.astype(F), F(-87), F(88))
    n = (x * F(1.44269504) + F(12582912.0)) - F(12582912.0)
    r = x - n * F(0.693359375)
    r = r - n * F(-2.12194440e-4)
    scale = ((n.astype(np.int32) + 127) << 23).view(F)
    return (horner(EXP_Q, r) * r * r + r + F(1)) * scale


def erfcf(z):
    z = np.minimum(z.astype(F), F(9))
    t = F(1) / (F(1) + F(0.5) * z)
    return t * expf(-z * z) * expf(horner(ERFC_P, t))


if __name__ == "__main__":
    np.set_printoptions(precision=9)
    print("exp q, highest degree first:", [f"{c:.9e}" for c in EXP_Q[::-1]])
    print("erfc P, highest degree first:", [f"{c:.9e}" for c in ERFC_P[::-1]])
    x = np.linspace(-87, 88, 2_000_001).astype(F)
    err = np.abs(expf(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)
    print(f"float32 exp: max relative error {err.max():.2e}")
    zz = np.linspace(0, 9, 2_000_001).astype(F)
    err = np.abs(erfcf(zz).astype(np.float64) / erfc(zz.astype(np.float64)) - 1)
    small = zz <= 4
    print(f"float32 erfc: max relative error {err[small].max():.2e} on [0, 4], "
          f"{err.max():.2e} on [0, 9] (there z*z's rounding dominates)")
