"""Stock items and the inventory container that tracks them."""

from __future__ import annotations

from dataclasses import dataclass


class InventoryError(Exception):
    """Raised when an inventory operation cannot be carried out."""


@dataclass
class Item:
    """A stock-keeping unit.

    Prices are integer cents so that totals never suffer from float drift.
    """

    sku: str
    name: str
    price_cents: int
    quantity: int = 0
    reorder_level: int = 5
    reorder_quantity: int = 20

    def __post_init__(self) -> None:
        if not self.sku.strip():
            raise InventoryError("sku must not be blank")
        if self.price_cents < 0:
            raise InventoryError("price must not be negative")
        if self.quantity < 0 or self.reorder_level < 0:
            raise InventoryError("quantities must not be negative")

    @property
    def value_cents(self) -> int:
        """Total value of the units on hand."""
        return self.price_cents * self.quantity

    def needs_restock(self) -> bool:
        """True when the stock on hand is at or below the reorder level."""
        return self.quantity <= self.reorder_level


class Inventory:
    """A collection of items that supports reserving stock for orders."""

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._reserved: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, sku: object) -> bool:
        return sku in self._items

    def add(self, item: Item) -> None:
        """Register a new item; skus must be unique."""
        if item.sku in self._items:
            raise InventoryError(f"duplicate sku: {item.sku}")
        self._items[item.sku] = item
        self._reserved[item.sku] = 0

    def get(self, sku: str) -> Item:
        """Return the item for ``sku`` or raise ``InventoryError``."""
        if sku not in self._items:
            raise InventoryError(f"unknown sku: {sku}")
        return self._items[sku]

    def remove(self, sku: str) -> Item:
        """Remove an item that has no outstanding reservations."""
        item = self.get(sku)
        if self._reserved[sku] > 0:
            raise InventoryError(f"{sku} has reserved units")
        del self._items[sku]
        del self._reserved[sku]
        return item

    def reserved(self, sku: str) -> int:
        """Units of ``sku`` currently held for orders."""
        self.get(sku)
        return self._reserved[sku]

    def available(self, sku: str) -> int:
        """Units on hand that are not reserved."""
        return self.get(sku).quantity - self._reserved[sku]

    def receive(self, sku: str, count: int) -> int:
        """Add ``count`` delivered units and return the new quantity."""
        if count <= 0:
            raise InventoryError("count must be positive")
        item = self.get(sku)
        item.quantity += count
        return item.quantity

    def reserve(self, sku: str, count: int) -> int:
        """Reserve units for an order; return the units still available."""
        if count <= 0:
            raise InventoryError("count must be positive")
        if count > self.available(sku):
            raise InventoryError(f"insufficient stock for {sku}")
        self._reserved[sku] += count
        return self.available(sku)

    def release(self, sku: str, count: int) -> None:
        """Return previously reserved units to the available pool."""
        if count <= 0 or count > self.reserved(sku):
            raise InventoryError(f"cannot release {count} units of {sku}")
        self._reserved[sku] -= count

    def ship(self, sku: str, count: int) -> None:
        """Remove reserved units from stock because they left the warehouse."""
        if count <= 0 or count > self.reserved(sku):
            raise InventoryError(f"cannot ship {count} units of {sku}")
        self._reserved[sku] -= count
        self._items[sku].quantity -= count

    def total_value_cents(self) -> int:
        """Value of all stock on hand, reserved units included."""
        total = 0
        for item in self._items.values():
            total += item.value_cents
        return total

    def low_stock(self) -> list[str]:
        """Sorted skus of the items that need restocking."""
        return sorted(sku for sku, item in self._items.items() if item.needs_restock())

    def restock_plan(self, budget_cents: int | None = None) -> dict[str, int]:
        """Units to order so that each low item reaches its reorder target.

        The target of an item is ``reorder_level + reorder_quantity``. Items
        furthest below their reorder level are served first; with a budget,
        each item gets as many units as the remaining money affords.
        """
        plan: dict[str, int] = {}
        remaining = budget_cents
        low = [item for item in self._items.values() if item.needs_restock()]
        low.sort(key=lambda item: (item.quantity - item.reorder_level, item.sku))
        for item in low:
            units = item.reorder_level + item.reorder_quantity - item.quantity
            if remaining is not None and item.price_cents > 0:
                units = min(units, remaining // item.price_cents)
                remaining -= units * item.price_cents
            if units > 0:
                plan[item.sku] = units
        return plan
