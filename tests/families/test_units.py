"""Tools of the units family: direct unit conversions and pair-quoted currency exchange."""

from __future__ import annotations

from task_families.units import tools
from task_families.units.family import FAMILY
from task_families.units.tools import convert, exchange


def test_tools_are_deterministic():
    for _ in range(2):
        assert convert(12, "ft", "in") == convert("12", " FT", "In ") == "144 in"
        assert exchange(250, "EUR", "USD") == exchange("250", "eur", "usd") == "260.95 USD"


def test_hand_checked_unit_chain():
    # 12 ft = 144 in = 365.76 cm = 3.6576 m, shown to 2 decimals
    assert convert(12, "ft", "in") == "144 in"
    assert convert(144, "in", "cm") == "365.76 cm"
    assert convert(365.76, "cm", "m") == "3.66 m"
    assert convert(1, "lb", "kg") == "0.4536 kg"      # small quantities keep 4 decimals
    assert convert(2.5, "h", "min") == "150 min"
    assert convert(1, "mi", "km") == "1.61 km"


def test_exchange_rates_are_pair_specific_with_a_spread():
    direct = float(exchange(250, "EUR", "GBP").split()[0])
    via_usd = float(exchange(float(exchange(250, "EUR", "USD").split()[0]), "USD", "GBP").split()[0])
    assert direct == 205.73 and abs(direct - via_usd) > 0.5
    # within 4% of the rough value ratio (1 EUR ~ 1.08 USD)
    assert 0.96 * 270 <= 260.95 <= 1.04 * 270
    for a in tools.CURRENCIES:
        for b in tools.CURRENCIES:
            if a != b:
                assert exchange(100, a, b).endswith(f" {b}")


def test_bad_arguments_are_error_text():
    assert convert(12, "ft", "m").startswith("error: no direct conversion ft to m; ft converts to: in, yd")
    assert convert(12, "furlong", "m").startswith("error: unknown unit 'furlong'")
    assert convert("twelve", "ft", "in").startswith("error: value must be a number")
    assert convert(float("nan"), "ft", "in").startswith("error:")
    assert exchange(10, "EUR", "XYZ").startswith("error: unknown currency 'XYZ'")
    assert exchange(10, "EUR", "EUR").startswith("error:")
    assert exchange("lots", "EUR", "USD").startswith("error: amount must be a number")
    assert all(len(convert(1, "ft", u)) <= 120 for u in tools.UNITS)


def test_difficulty_sets_legs_and_checker_tolerance():
    easy, hard = FAMILY.generate(3, 1, difficulty=0.0)[0], FAMILY.generate(3, 1, difficulty=1.0)[0]
    assert len(FAMILY.solution(easy)) == 2 and len(FAMILY.solution(hard)) == 5
    inst = FAMILY.generate(5, 1)[0]
    want = float(inst.answer)
    assert FAMILY.check(inst, f"Answer: {want:,.2f} units") == 1.0
    assert FAMILY.check(inst, f"Answer: {want * 1.01 + 1:.2f}") == 0.0
    assert FAMILY.check(inst, f"{want}") == 0.0  # no "Answer:"
