"""Tools of the inventory family (the inner model calls these; identical in training and eval).

The world is a fixed, hash-defined parts market: suppliers ``s1`` .. ``s12`` each carry about half
of the 30 items, at a unit price (2..49) and with a stock level (5..120) that are pure functions of
the supplier id and the item name.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

N_SUPPLIERS = 12
SUPPLIERS = tuple(f"s{i}" for i in range(1, N_SUPPLIERS + 1))
ITEMS = ("bolt", "nut", "screw", "washer", "hinge", "spring", "gear", "valve", "pipe", "cable",
         "fuse", "relay", "switch", "lamp", "fan", "belt", "pump", "seal", "clamp", "bracket",
         "hose", "chain", "rivet", "nail", "bearing", "filter", "motor", "sensor", "panel", "wheel")
MAX_QUANTITY = 10_000

_SUPPLIER = re.compile(r"s([1-9]\d?)")
_LINE = re.compile(r"^(\d+)\s*(?:x\s*)?([a-z]+?)s?$|^([a-z]+?)s?\s*[:=x]\s*(\d+)$")


@lru_cache(maxsize=8192)
def _h(*parts: str) -> int:
    return int(hashlib.sha256(":".join(("inventory",) + parts).encode("utf-8")).hexdigest()[:12], 16)


def carries(supplier: str, item: str) -> bool:
    """Whether a supplier carries an item (not a tool; canonical names)."""
    return _h(supplier, item, "carry") % 2 == 0


def unit_price(supplier: str, item: str) -> int:
    return 2 + _h(supplier, item, "price") % 48


def stock(supplier: str, item: str) -> int:
    return 5 + _h(supplier, item, "stock") % 116


def _item(name: str) -> str | None:
    name = name.strip().lower()
    if name in ITEMS:
        return name
    if name.endswith("es") and name[:-2] in ITEMS:
        return name[:-2]
    if name.endswith("s") and name[:-1] in ITEMS:
        return name[:-1]
    return None


def _split(text: str) -> list[str]:
    return [p.strip() for p in re.split(r",|;|\band\b|\+", str(text).lower()) if p.strip()]


def find_suppliers(items: str) -> str:
    """List the suppliers that carry every one of the given items.

    Items: bolt nut screw washer hinge spring gear valve pipe cable fuse relay switch lamp fan belt
    pump seal clamp bracket hose chain rivet nail bearing filter motor sensor panel wheel.

    Args:
        items: Item names separated by commas, e.g. "bolt, nut".

    Returns:
        Supplier ids such as "s2, s5, s9", "none", or a message starting with "error:".
    """
    names = _split(items)
    if not names:
        return "error: give at least one item name, e.g. \"bolt, nut\""
    wanted = []
    for n in names:
        item = _item(n)
        if item is None:
            return f"error: unknown item {n[:20]!r}; items are e.g. bolt, nut, gear, valve"
        wanted.append(item)
    found = [s for s in SUPPLIERS if all(carries(s, i) for i in wanted)]
    return ", ".join(found) or "none"


def quote(supplier: str, order: str) -> str:
    """Price a whole order at one supplier (sum of unit price times quantity).

    Args:
        supplier: A supplier id from s1 to s12, e.g. "s5".
        order: Quantities and items separated by commas, e.g. "30 bolt, 12 nut".

    Returns:
        "cost=<total>" when the supplier can fill the order, otherwise what is missing (an item it
        does not carry, or too little stock), or a message starting with "error:".
    """
    sid = str(supplier).strip().lower()
    m = _SUPPLIER.fullmatch(sid)
    if m is None or int(m.group(1)) > N_SUPPLIERS:
        return f"error: unknown supplier {str(supplier)[:20]!r}; ids are s1..s{N_SUPPLIERS}"
    lines = _split(order)
    if not lines:
        return "error: empty order; write it like \"30 bolt, 12 nut\""
    wanted: dict[str, int] = {}
    for line in lines:
        lm = _LINE.match(re.sub(r"\s+", " ", line))
        if lm is None:
            return f"error: cannot read {line[:20]!r}; write the order like \"30 bolt, 12 nut\""
        qty = int(lm.group(1) or lm.group(4))
        item = _item(lm.group(2) or lm.group(3))
        if item is None:
            return f"error: unknown item in {line[:20]!r}; items are e.g. bolt, nut, gear, valve"
        if not 1 <= qty <= MAX_QUANTITY:
            return f"error: quantity must be 1..{MAX_QUANTITY}, got {qty}"
        wanted[item] = wanted.get(item, 0) + qty
    missing = [i for i in wanted if not carries(sid, i)]
    if missing:
        return f"{sid} does not carry: {', '.join(missing)}"
    short = [f"{stock(sid, i)} {i}" for i, q in wanted.items() if stock(sid, i) < q]
    if short:
        return f"{sid} has only {', '.join(short)}"
    return f"cost={sum(unit_price(sid, i) * q for i, q in wanted.items())}"


TOOLS = [find_suppliers, quote]
