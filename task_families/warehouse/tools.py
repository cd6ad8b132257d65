"""Tools of the warehouse family: the first *stateful* family. The inner model acts on a small world (bins of
stock and one box to pack) that its calls change; the checker judges the world it leaves.

Every tool takes the episode's world as its last argument, ``world``. The harness creates one
:class:`World` per episode (:func:`new_world` from the instance's ``info["world"]``) and fills that argument
itself: the model never sees it in a schema and cannot pass it (the hidden eval and the teacher go through
``TaskFamily.call_tool``; a verifiers job injects it with ``StatefulToolEnv.update_tool_args``). Nothing here
is module-global, so concurrent episodes never see each other's worlds.

The world: bins ``b1`` .. ``b6`` holding stock of the items below, an open box, and a box label fixed by the
world's secret ``seed`` and the box's contents (so a label cannot be guessed without really sealing the
right box). State changes: ``pick`` moves stock from a bin into the box (there is no way to put it back)
and ``seal_box`` closes the box for good (nothing can be packed after).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

ITEMS = ("mug", "lamp", "kettle", "towel", "pillow", "candle", "vase", "clock", "brush", "plate",
         "bowl", "spoon", "fork", "knife", "jar", "bottle", "cup", "tray", "basket", "blanket",
         "mirror", "rug", "chair", "stool", "shelf", "hook", "bucket", "broom", "sponge", "teapot")
BINS = tuple(f"b{i}" for i in range(1, 7))
MAX_QUANTITY = 99

_BIN = re.compile(r"b([1-9])")


class World:
    """One episode's warehouse: ``bins`` (bin -> item -> count), the ``box`` packed so far, and its label
    once sealed. Built from a JSON-able spec (:func:`new_world`); the spec itself is never changed."""

    def __init__(self, spec: dict[str, Any] | str) -> None:
        if isinstance(spec, str):
            spec = json.loads(spec)
        self.seed = str(spec["seed"])
        # a datasets (Arrow) row fills the items other rows have with None: they are not in the bin
        self.bins: dict[str, dict[str, int]] = {b: {i: int(n) for i, n in (items or {}).items() if n}
                                                for b, items in spec["bins"].items()}
        self.box: dict[str, int] = {}
        self.label: str | None = None
        self.calls = 0

    @property
    def sealed(self) -> bool:
        return self.label is not None

    def snapshot(self) -> dict[str, Any]:
        """The world's state as plain data (for records and tests)."""
        return {"bins": {b: dict(v) for b, v in self.bins.items()}, "box": dict(self.box), "label": self.label}


def new_world(spec: dict[str, Any] | str) -> World:
    """A fresh world from an instance's ``info["world"]`` (one per episode): ``{"seed": ..., "bins": {bin:
    {item: count}}}``, or that as a JSON string. Counts that are None (what a datasets row holds for the items
    of other rows) or 0 mean the bin has none."""
    return World(spec)


def order_of(order: dict[str, Any] | str | None) -> dict[str, int]:
    """An order (``info["order"]``: item -> quantity, or that as JSON) without the None entries a datasets row
    adds for the items of other rows."""
    if isinstance(order, str):
        order = json.loads(order)
    return {str(i): int(q) for i, q in (order or {}).items() if q}


def box_text(contents: dict[str, int]) -> str:
    """Box contents as the tools write them: "4 mug, 2 lamp" (items in alphabetical order)."""
    return ", ".join(f"{n} {i}" for i, n in sorted(contents.items())) or "empty"


def box_label(seed: str, contents: dict[str, int]) -> str:
    """The label a box with ``contents`` gets when sealed in the world of ``seed``: ``W-0421``."""
    digest = hashlib.sha256(f"warehouse:{seed}:{box_text(contents)}".encode("utf-8")).hexdigest()
    return f"W-{int(digest[:8], 16) % 10_000:04d}"


def _item(name: Any) -> str | None:
    name = str(name).strip().lower()
    if name in ITEMS:
        return name
    if name.endswith("s") and name[:-1] in ITEMS:
        return name[:-1]
    return None


def find_item(item: str, world: World) -> str:
    """List the bins that hold an item, with how many each holds, most stock first.

    Args:
        item: An item name, e.g. "mug".

    Returns:
        Bins and counts such as "b5: 8, b2: 3", "none", or a message starting with "error:".
    """
    world.calls += 1
    name = _item(item)
    if name is None:
        return f"error: unknown item {str(item)[:20]!r}; items are e.g. mug, lamp, vase"
    held = sorted(((n, b) for b, items in world.bins.items() if (n := items.get(name, 0)) > 0),
                  key=lambda nb: (-nb[0], nb[1]))
    return ", ".join(f"{b}: {n}" for n, b in held) or "none"


def pick(bin: str, item: str, quantity: int, world: World) -> str:
    """Move items from a bin into the box. Picked items cannot be put back.

    Args:
        bin: A bin id from b1 to b6, e.g. "b2".
        item: An item name, e.g. "mug".
        quantity: How many to move into the box.

    Returns:
        The box's contents after the pick, or a message starting with "error:" (nothing moved).
    """
    world.calls += 1
    if world.sealed:
        return f"error: the box is sealed ({world.label}); nothing more can be packed"
    bid = str(bin).strip().lower()
    if _BIN.fullmatch(bid) is None or bid not in world.bins:
        return f"error: unknown bin {str(bin)[:20]!r}; bins are b1..b{len(world.bins)}"
    name = _item(item)
    if name is None:
        return f"error: unknown item {str(item)[:20]!r}; items are e.g. mug, lamp, vase"
    try:
        qty = int(quantity)
    except (TypeError, ValueError, OverflowError):
        return f"error: quantity must be a whole number, got {str(quantity)[:20]!r}"
    if not 1 <= qty <= MAX_QUANTITY:
        return f"error: quantity must be 1..{MAX_QUANTITY}, got {qty}"
    have = world.bins[bid].get(name, 0)
    if have < qty:
        return f"error: {bid} holds only {have} {name}"
    world.bins[bid][name] = have - qty
    world.box[name] = world.box.get(name, 0) + qty
    return f"box: {box_text(world.box)}"


def seal_box(world: World) -> str:
    """Seal the box and print its label. Nothing can be packed after sealing.

    Returns:
        "sealed <label>: <contents>", or a message starting with "error:".
    """
    world.calls += 1
    if world.sealed:
        return f"error: the box is already sealed ({world.label})"
    if not world.box:
        return "error: the box is empty; pick the order's items first"
    world.label = box_label(world.seed, world.box)
    return f"sealed {world.label}: {box_text(world.box)}"


TOOLS = [find_item, pick, seal_box]
#: The tool parameter that is the episode's world (injected by the harness, hidden from the model).
STATE_ARGS = ("world",)
