"""Deterministic initialisation: every module draws its parameters from a seeded generator.

Values are drawn in float64 and then rounded to the module's dtype, so a float32 model and a
float64 model built from the same seed hold the same numbers (up to that rounding).
The distributions are torch's defaults for the same layers (the numbers differ: torch has
its own generator).
"""
from __future__ import annotations

import math

import numpy as np

# What every seed= argument of resnorm.nn accepts.
Seed = int | np.random.SeedSequence | np.random.Generator


def generator(seed):
    """A numpy Generator from an int, a SeedSequence or a Generator (used as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer,
                                                                   np.random.SeedSequence)):
        raise TypeError(f"seed must be an int, a numpy SeedSequence or Generator, "
                        f"got {type(seed).__name__}")
    return np.random.default_rng(seed)


def child_seeds(seed, n):
    """n independent integer seeds derived from seed (for sub-modules, in a fixed order)."""
    return [int(s) for s in generator(seed).integers(0, 2**63 - 1, size=n)]


def uniform(rng, shape, bound, dtype):
    """U(-bound, bound) of this shape, drawn in float64, rounded to dtype."""
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def linear_bound(fan_in):
    """torch.nn.Linear's default: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    return 1.0 / math.sqrt(fan_in)


def xavier_bound(fan_in, fan_out):
    """torch.nn.init.xavier_uniform_: U(-a, a), a = sqrt(6 / (fan_in + fan_out))."""
    return math.sqrt(6.0 / (fan_in + fan_out))


def normal(rng, shape, std, dtype):
    """N(0, std^2) of this shape, drawn in float64, rounded to dtype."""
    return (std * rng.standard_normal(shape)).astype(dtype)


def xavier_std(fan_in, fan_out):
    """torch.nn.init.xavier_normal_ (gain 1): N(0, s^2), s = sqrt(2 / (fan_in + fan_out))."""
    return math.sqrt(2.0 / (fan_in + fan_out))
