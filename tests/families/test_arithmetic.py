"""The arithmetic family's calculator: exact integers, errors as text, and nothing on stderr for what a
model types (a SyntaxWarning from the parser was printed into every training log)."""

from __future__ import annotations

import warnings

from task_families.arithmetic.tools import calculator


def test_results_and_errors_and_no_warning_leaks():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert calculator("(3*8)+19") == "43" and calculator("-2 * (5 - 9)") == "8"
        for text in ("3x4", "12and 5", "2**3", "1.5 + 2", "print(1)", "9" * 300):
            assert calculator(text).startswith("error:"), text
