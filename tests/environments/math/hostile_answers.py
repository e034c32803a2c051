"""A corpus of hostile final answers, by class. Every one must score 0 against any gold of a real task, quickly,
without a crash, a file written or a process started on the host.

``corpus(marker_dir)`` fills in, for each string that would run code if anything evaluated it, a path under
``marker_dir`` that the code would create; a test then checks that the folder stays empty.
"""

from __future__ import annotations

import base64
import pickle

# The string that, read by sympy's parse_expr, replaced sympy.simplify in the checking process so that
# "simplify(gold - answer) == 0" held for every gold: one fixed answer scored 1.0 on every task.
SIMPLIFY_PATCH = "(setattr(__import__('sympy'), 'simplify', lambda e, *a, **k: 0), 0)[1]"


class _Touch:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def _code(m: str) -> list[str]:
    """Strings that run code (creating a folder under ``m``) if anything evaluates them."""
    q = repr
    return [
        f"__import__('os').system('touch {m}/system')",
        f"__import__('os').mkdir({q(m + '/mkdir')})",
        f"\\boxed{{__import__('os').mkdir({q(m + '/boxed')})}}",
        f"<answer>__import__('os').mkdir({q(m + '/tagged')})</answer>",
        f"$__import__('os').mkdir({q(m + '/dollars')})$",
        f"(lambda: __import__('os').mkdir({q(m + '/lambda')}))()",
        f"exec(\"import os; os.mkdir({q(m + '/exec')})\")",
        f"eval(\"__import__('os').mkdir({q(m + '/eval')})\")",
        f"getattr(__import__('os'), 'mkdir')({q(m + '/getattr')})",
        f"__builtins__['__import__']('os').mkdir({q(m + '/builtins')})",
        f"[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0](['touch', '{m}/popen'])",
        f"Symbol('x').__class__.__init__.__globals__['__builtins__']['__import__']('os').mkdir({q(m + '/globals')})",
        f"Function('f')(__import__('os').mkdir({q(m + '/function')}))",
        f"x + __import__('os').mkdir({q(m + '/sum')})",
        f"1 if __import__('os').mkdir({q(m + '/cond')}) else 1",
        f"\\frac{{__import__('os').mkdir({q(m + '/frac')})}}{{1}}",
        f"\\sqrt{{__import__('os').mkdir({q(m + '/sqrt')})}}",
        f"\\text{{__import__('os').mkdir({q(m + '/text')})}}",
        f"\\mathrm{{__import__('os').mkdir({q(m + '/mathrm')})}}",
        f"\\operatorname{{__import__('os').mkdir({q(m + '/operatorname')})}}(1)",
        f"sympify(\"__import__('os').mkdir({q(m + '/sympify')})\")",
        f"S(\"__import__('os').mkdir({q(m + '/S')})\")",
        f"lambdify(x, \"__import__('os').mkdir({q(m + '/lambdify')})\")(1)",
        f"pickle.loads({pickle.dumps(_Touch(m + '/pickle_call'))!r})",
        pickle.dumps(_Touch(m + "/pickle_text"), protocol=0).decode("latin-1"),
        base64.b64encode(pickle.dumps(_Touch(m + "/pickle_b64"))).decode(),
        f"cos\nmkdir\n(S'{m}/pickle_proto0'\ntR.",
        f"__import__('subprocess').Popen(['touch', '{m}/subprocess'])",
        f"open('{m}/open', 'w').write('x')",
        f"__import__('pathlib').Path('{m}/pathlib').touch()",
        f"{SIMPLIFY_PATCH} + __import__('os').mkdir({q(m + '/patch')})",
    ]


FOOLING = [
    SIMPLIFY_PATCH,
    "(setattr(__import__('sympy').core.relational.Equality, '__bool__', lambda s: True), 0)[1]",
    "(setattr(__import__('math_verify'), 'verify', lambda *a, **k: True), 0)[1]",
    "__import__('sympy').Symbol('gold')",
    "\\infty - \\infty",
    "0/0",
    "\\text{nan}",
    "\\tilde{\\infty}",
    "x",
    "x = x",
    "1 = 1",
    "a = a",
    "\\mathbb{R}",
    "(-\\infty, \\infty)",
    "[-\\infty, \\infty]",
    "\\{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20\\}",
    "\\emptyset",
    "\\pm\\infty",
    "True",
    "\\text{any answer}",
    "\\text{the gold}",
    "\\boxed{}",
    "<answer></answer>",
    "<answer>",
    "</answer>",
    "\\boxed{\\boxed{\\boxed{}}}",
    "x \\in \\mathbb{R}",
    "0 \\cdot \\infty",
    "\\lim_{x \\to \\infty} x",
    "\\forall x",
    "E",
    "zoo",
    "nan",
]

HANGING = [
    "9**9**9**9",
    "9^{9^{9^{9}}}",
    "\\boxed{9^{9^{9^{9}}}}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "(10^{10})!",
    "\\boxed{(10^{10})!}",
    "3!!!!",
    "1000!!",
    "x^{10^{9}}",
    "(x+1)^{10^{7}}",
    "\\sqrt{2}^{10^{8}}",
    "factorial(10**9)",
    "(" * 10_000 + "1" + ")" * 10_000,
    "{" * 10_000 + "1" + "}" * 10_000,
    "\\frac{" * 100_000,
    "\\sqrt{" * 100_000 + "2" + "}" * 100_000,
    "-" * 100_000 + "1",
    "1" * 1_000_000,
    "9" * 5_000,
    "1" + "0" * 400,
    "x" * 1_000_000,
    "1+" * 500_000 + "1",
    "\\boxed{" * 100_000,
    "<answer>" * 100_000,
    "\\text{" * 100_000,
    "1 " * 500_000 + "dollars",
    ("a" * 30 + "\\text{") * 30_000,
]

UNICODE = [
    "\u202e21",                  # right-to-left override
    "1\u200b2",                  # zero-width space
    "１２",                      # fullwidth digits
    "١٢",                        # Arabic-Indic digits
    "12\x00",
    "\x00",
    "\ud800",                    # a lone surrogate
    "½",
    "√2",
    "2²",
    "Ⅻ",
    "١/٢",
    "\u0301" * 1000,
    "∞",
    "🤖",
    "x\u0338",
]


def corpus(marker_dir: str) -> dict[str, list[str]]:
    """The corpus by class; code strings create folders under ``marker_dir`` if anything runs them."""
    return {"code": _code(marker_dir), "fooling": FOOLING, "hanging": HANGING, "unicode": UNICODE}
