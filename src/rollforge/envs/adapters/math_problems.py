"""Generated math problems whose answers are best checked symbolically (for ``math``).

Four kinds, chosen so that a correct answer has several written forms that string matching would
reject and math-verify accepts: a sum of fractions (``\\frac{19}{12}``, ``19/12``, ``1.58333...``),
a linear equation with a fractional root, the simplification of a square root
(``5\\sqrt{2}``), and the expansion of a difference of squares (``4x``, ``4 x``). Gold answers
are LaTeX. The same seed gives the same problems; problem ``i`` does not depend on ``n``.
"""

from __future__ import annotations

import random
from fractions import Fraction

from ...types import Message, Sample

SYSTEM_PROMPT = "Solve the problem. Put your final answer in \\boxed{}, for example \\boxed{3}."


def _latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _fraction_sum(rng: random.Random) -> tuple[str, str]:
    a, b = Fraction(rng.randint(1, 9), rng.randint(2, 9)), Fraction(rng.randint(1, 9), rng.randint(2, 9))
    question = f"Compute {a.numerator}/{a.denominator} + {b.numerator}/{b.denominator} as a fraction in lowest terms."
    return question, _latex(a + b)


def _linear_equation(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.randint(2, 9), rng.randint(-20, 20), rng.randint(-20, 20)
    return f"Solve for x: {a}x + ({b}) = {c}.", _latex(Fraction(c - b, a))


def _square_root(rng: random.Random) -> tuple[str, str]:
    outside, inside = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
    return f"Simplify sqrt({outside * outside * inside}).", f"{outside}\\sqrt{{{inside}}}"


def _difference_of_squares(rng: random.Random) -> tuple[str, str]:
    k = rng.randint(1, 9)
    return f"Expand and simplify (x + {k})^2 - (x - {k})^2.", f"{4 * k}x"


KINDS = (_fraction_sum, _linear_equation, _square_root, _difference_of_squares)


def samples(n: int, seed: int) -> list[Sample]:
    out = []
    for index in range(n):
        rng = random.Random(f"math:{seed}:{index}")
        kind = KINDS[rng.randrange(len(KINDS))]
        question, answer = kind(rng)
        prompt = (Message("system", SYSTEM_PROMPT), Message("user", question))
        metadata = {"answer": answer, "kind": kind.__name__.strip("_")}
        out.append(Sample(prompt=prompt, task_name="math", row={"metadata": metadata}))
    return out
