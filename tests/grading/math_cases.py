"""The math grading table: (gold, response, expected verdict, what it shows). Shared by
tests/grading/test_math_grading.py and benchmarks/grading.py."""

B = "\\boxed{{{}}}".format

MATH_CASES: list[tuple[str, str, bool, str]] = [
    # integers and decimals
    ("42", B("42"), True, "same integer"),
    ("42", B("41"), False, "different integer"),
    ("42", B("42.0"), True, "integer as a decimal"),
    ("-7", B("-7"), True, "negative integer"),
    ("-7", B("7"), False, "sign matters"),
    ("0.5", B("\\frac{1}{2}"), True, "decimal vs fraction"),
    ("\\frac{1}{2}", B("0.5"), True, "fraction vs decimal"),
    ("3.14", B("3.15"), False, "close decimals differ"),
    ("\\frac{1}{3}", B("0.333333"), True, "a decimal rounded to 6 places (math-verify's rounding)"),
    ("\\frac{1}{3}", B("0.33"), False, "a decimal rounded to 2 places"),
    ("17", B("(17)"), True, "a number in parentheses"),
    ("1000", B("1,000"), True, "thousands separator"),
    ("100000000000000000001", B("100000000000000000000"), False, "big integers differ (not only to 15 digits)"),
    # fractions and LaTeX forms
    ("\\frac{3}{4}", B("\\dfrac{3}{4}"), True, "\\dfrac"),
    ("\\frac{3}{4}", B("\\tfrac34"), True, "\\tfrac without braces"),
    ("\\frac{3}{4}", B("3/4"), True, "slash fraction"),
    ("\\frac{3}{4}", B("\\frac{6}{8}"), True, "unreduced fraction"),
    ("\\frac{3}{4}", B("\\frac{4}{3}"), False, "inverted fraction"),
    ("-\\frac{1}{3}", B("\\frac{-1}{3}"), True, "sign inside the fraction"),
    ("\\sqrt{2}", B("2^{1/2}"), True, "root as a power"),
    ("\\sqrt{8}", B("2\\sqrt{2}"), True, "simplified root"),
    ("\\sqrt{2}", B("\\sqrt{3}"), False, "different roots"),
    ("\\frac{\\sqrt{3}}{2}", B("\\frac{1}{2}\\sqrt{3}"), True, "root in a fraction"),
    ("2\\pi", B("2 \\pi"), True, "spacing"),
    ("\\pi", B("3.14"), False, "pi is not 3.14"),
    ("10^{3}", B("1000"), True, "power of ten"),
    ("\\left( 1, 2 \\right)", B("(1,2)"), True, "\\left( \\right)"),
    ("$5$", B("5"), True, "dollar signs in the gold"),
    ("5", "The answer is \\boxed{3}, no wait: \\boxed{5}", True, "the last box counts"),
    ("5", "\\boxed{5} ... actually \\boxed{3}", False, "the last box counts (wrong)"),
    ("\\frac{1}{2}", B("\\frac{1}{2}") + " so", True, "text after the box"),
    # symbolic
    ("x^2+2x+1", B("(x+1)^2"), True, "expanded vs factored"),
    ("x^2-1", B("(x-1)(x+1)"), True, "difference of squares"),
    ("x^2+1", B("(x+1)^2"), False, "different polynomials"),
    ("2x", B("2y"), False, "variables matter"),
    ("\\frac{x}{2}", B("0.5x"), True, "symbolic with a decimal coefficient"),
    ("x=3", B("3"), True, "an equation's value"),
    ("y = 2x + 1", B("2x+1"), True, "right-hand side of an equation"),
    # sets, tuples, intervals
    ("\\{1, 2\\}", B("\\{2, 1\\}"), True, "sets are unordered"),
    ("\\{1, 2\\}", B("\\{1, 3\\}"), False, "different sets"),
    ("(1, 2)", B("(1,2)"), True, "tuple spacing"),
    ("(1, 2)", B("(2, 1)"), False, "tuples are ordered"),
    ("[0, 1)", B("[0,1)"), True, "interval spacing"),
    ("[0, 1)", B("[0, 1]"), False, "open vs closed end"),
    ("(-\\infty, 3]", B("(-\\infty,3]"), True, "interval with infinity"),
    ("(-\\infty, 3]", B("x \\le 3"), False, "an inequality for an interval: math-verify's strict rule says no"),
    ("1, 2, 3", B("3, 2, 1"), True, "a list of solutions in another order"),
    # text, degrees, percent, units
    ("\\text{Monday}", B("\\text{Monday}"), True, "text answer"),
    ("30^\\circ", B("30"), True, "degrees"),
    ("50\\%", B("50"), True, "percent sign"),
    # format and pathological
    ("5", "5", False, "no box is wrong"),
    ("5", "\\boxed{}", False, "empty box"),
    ("5", "\\fbox{5}", False, "\\fbox is not \\boxed"),
    ("5", B("5" * 2000), False, "a huge answer is wrong without parsing"),
    ("\\frac{1}{2}", B("\\frac{1}{2"), False, "unbalanced braces"),
]
