"""Tools of the units family (the inner model calls these; identical in training and eval).

``convert`` knows only *direct* conversions between neighbouring units (ft<->in, in<->cm, cm<->m,
...), with exact factors; longer conversions take several calls. ``exchange`` converts money at the
exchange desk's quoted rate for each ordered currency pair: the rates are fixed, hash-defined and
include a spread, so a direct EUR->GBP exchange gives a different amount than EUR->USD->GBP.
Results are rounded (money and unit quantities of at least 1 to 2 decimals, smaller
quantities to 4) and every call is a pure function of its
arguments.
"""

from __future__ import annotations

import hashlib
import math

# Direct conversions: (a, b, factor) means 1 a = factor b.
_EDGES = (
    # length
    ("cm", "mm", 10), ("m", "cm", 100), ("km", "m", 1000), ("ft", "in", 12), ("yd", "ft", 3),
    ("mi", "yd", 1760), ("in", "cm", 2.54), ("mi", "km", 1.609344), ("yd", "m", 0.9144),
    # mass
    ("g", "mg", 1000), ("kg", "g", 1000), ("t", "kg", 1000), ("lb", "oz", 16), ("lb", "kg", 0.45359237),
    ("oz", "g", 28.349523125), ("st", "lb", 14),
    # volume
    ("l", "ml", 1000), ("tbsp", "tsp", 3), ("cup", "tbsp", 16), ("pt", "cup", 2), ("qt", "pt", 2),
    ("gal", "qt", 4), ("gal", "l", 3.785411784), ("cup", "ml", 236.5882365), ("tsp", "ml", 4.92892159375),
    # time
    ("min", "s", 60), ("h", "min", 60), ("d", "h", 24), ("wk", "d", 7),
)
FACTORS: dict[tuple[str, str], float] = {}
for _a, _b, _f in _EDGES:
    FACTORS[(_a, _b)] = float(_f)
    FACTORS[(_b, _a)] = 1.0 / _f
UNITS = tuple(sorted({u for a, b, _ in _EDGES for u in (a, b)}))
NEIGHBORS: dict[str, tuple[str, ...]] = {u: tuple(b for (a, b) in FACTORS if a == u) for u in UNITS}

# Rough value of one unit of each currency in USD; quoted rates add a pair-specific spread.
_USD_VALUE = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CHF": 1.12, "CAD": 0.73,
              "AUD": 0.66, "SEK": 0.095, "INR": 0.012, "CNY": 0.14, "MXN": 0.058, "BRL": 0.2}
CURRENCIES = tuple(_USD_VALUE)

_MAX = 1e9


def _fmt(x: float, decimals: int) -> str:
    text = f"{round(x, decimals):.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _number(value: object) -> float | None:
    if isinstance(value, str):
        value = value.replace(",", "").strip()
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and abs(x) <= _MAX else None


def _rate(from_currency: str, to_currency: str) -> float:
    """The quoted rate (amount of ``to_currency`` per 1 ``from_currency``); not a tool."""
    a, b = from_currency.upper(), to_currency.upper()
    digest = hashlib.sha256(f"units:rate:{a}:{b}".encode("utf-8")).hexdigest()
    spread = 1.0 + ((int(digest[:8], 16) % 801) - 400) / 10000.0  # within +-4%
    raw = _USD_VALUE[a] / _USD_VALUE[b] * spread
    return float(f"{raw:.5g}")


def _leg(quantity: object, what: str, ends: tuple[str, str], known: tuple[str, ...], kind: str,
         kinds: str) -> float | str:
    """The quantity of one leg as a number, or the error message when it is not a number or an end of
    the leg is not one of ``known``; not a tool."""
    x = _number(quantity)
    if x is None:
        return f"error: {what} must be a number, got {str(quantity)[:20]!r}"
    for end in ends:
        if end not in known:
            return f"error: unknown {kind} {end[:12]!r}; {kinds}: {' '.join(known)}"
    return x


def convert(value: float, from_unit: str, to_unit: str) -> str:
    """Convert a quantity between two directly related units (e.g. ft to in).

    Args:
        value: The quantity to convert, e.g. 12.
        from_unit: The unit of value, e.g. "ft".
        to_unit: A unit directly related to from_unit, e.g. "in".

    Returns:
        The converted quantity with its unit, e.g. "144 in", or a message starting with "error:".
    """
    a, b = str(from_unit).strip().lower(), str(to_unit).strip().lower()
    x = _leg(value, "value", (a, b), UNITS, "unit", "units")
    if isinstance(x, str):
        return x
    if (a, b) not in FACTORS:
        return f"error: no direct conversion {a} to {b}; {a} converts to: {', '.join(NEIGHBORS[a])}"
    y = x * FACTORS[(a, b)]
    return f"{_fmt(y, 2 if abs(y) >= 1 else 4)} {b}"


def exchange(amount: float, from_currency: str, to_currency: str) -> str:
    """Exchange money between two currencies at the desk's rate for that pair.

    Args:
        amount: The amount of money to exchange, e.g. 250.
        from_currency: The currency code of amount, e.g. "EUR".
        to_currency: The currency code to receive, e.g. "USD".

    Returns:
        The amount received with its currency, e.g. "271.53 USD", or a message starting with "error:".
    """
    a, b = str(from_currency).strip().upper(), str(to_currency).strip().upper()
    x = _leg(amount, "amount", (a, b), CURRENCIES, "currency", "currencies")
    if isinstance(x, str):
        return x
    if a == b:
        return f"error: {a} to {a} is not an exchange"
    return f"{_fmt(x * _rate(a, b), 2)} {b}"


TOOLS = [convert, exchange]
