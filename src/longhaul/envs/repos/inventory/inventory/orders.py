"""Customer orders that draw stock from an :class:`Inventory`."""

from __future__ import annotations

from dataclasses import dataclass

from .items import Inventory, InventoryError
from .pricing import add_tax, apply_discount, bulk_discount_percent

OPEN = "open"
PLACED = "placed"
SHIPPED = "shipped"
CANCELLED = "cancelled"

MAX_COUPON_PERCENT = 50


@dataclass
class OrderLine:
    """A quantity of one sku at a fixed unit price."""

    sku: str
    quantity: int
    unit_cents: int

    @property
    def gross_cents(self) -> int:
        return self.quantity * self.unit_cents

    @property
    def net_cents(self) -> int:
        """Line total after the quantity-based bulk discount."""
        return apply_discount(self.gross_cents, bulk_discount_percent(self.quantity))


class Order:
    """An order moves from open to placed to shipped, or gets cancelled."""

    def __init__(self, order_id: str, coupon_percent: float = 0, tax_rate: float = 8.0) -> None:
        if coupon_percent < 0 or coupon_percent > MAX_COUPON_PERCENT:
            raise InventoryError(f"coupon must be within 0..{MAX_COUPON_PERCENT} percent")
        self.order_id = order_id
        self.coupon_percent = coupon_percent
        self.tax_rate = tax_rate
        self.lines: list[OrderLine] = []
        self.state = OPEN

    def require(self, state: str) -> None:
        """Raise unless the order is currently in ``state``."""
        if self.state != state:
            raise InventoryError(f"order {self.order_id} is {self.state}, not {state}")

    def add_line(self, sku: str, quantity: int, unit_cents: int) -> OrderLine:
        """Add units of ``sku``; lines with the same sku and price are merged."""
        self.require(OPEN)
        if quantity <= 0:
            raise InventoryError("quantity must be positive")
        for line in self.lines:
            if line.sku == sku and line.unit_cents == unit_cents:
                line.quantity += quantity
                return line
        line = OrderLine(sku, quantity, unit_cents)
        self.lines.append(line)
        return line

    def remove_line(self, sku: str, quantity: int | None = None) -> None:
        """Remove ``quantity`` units of ``sku`` from its first line (all when omitted)."""
        self.require(OPEN)
        for index, line in enumerate(self.lines):
            if line.sku != sku:
                continue
            if quantity is None or quantity >= line.quantity:
                del self.lines[index]
            else:
                line.quantity -= quantity
            return
        raise InventoryError(f"{sku} is not in order {self.order_id}")

    @property
    def item_count(self) -> int:
        return sum(line.quantity for line in self.lines)

    def subtotal_cents(self) -> int:
        """Sum of the line totals after bulk discounts."""
        total = 0
        for line in self.lines:
            total += line.net_cents
        return total

    def coupon_cents(self) -> int:
        """Amount taken off the subtotal by the coupon."""
        subtotal = self.subtotal_cents()
        return subtotal - apply_discount(subtotal, self.coupon_percent)

    def total_cents(self) -> int:
        """Amount due: subtotal minus coupon, plus tax."""
        return add_tax(self.subtotal_cents() - self.coupon_cents(), self.tax_rate)


def shipping_cents(
    order_total_cents: int,
    item_count: int,
    free_threshold_cents: int = 5000,
    base_cents: int = 499,
    per_item_cents: int = 50,
) -> int:
    """Shipping fee: free above the threshold, otherwise base plus extra items."""
    if item_count <= 0 or order_total_cents >= free_threshold_cents:
        return 0
    return base_cents + per_item_cents * (item_count - 1)


def place_order(inventory: Inventory, order: Order) -> None:
    """Reserve stock for every line; nothing is reserved if any sku falls short."""
    order.require(OPEN)
    if not order.lines:
        raise InventoryError("cannot place an empty order")
    needed: dict[str, int] = {}
    for line in order.lines:
        needed[line.sku] = needed.get(line.sku, 0) + line.quantity
    for sku, count in needed.items():
        if inventory.available(sku) < count:
            raise InventoryError(f"insufficient stock for {sku}")
    for sku, count in needed.items():
        inventory.reserve(sku, count)
    order.state = PLACED


def ship_order(inventory: Inventory, order: Order) -> int:
    """Ship a placed order and return the number of units that left stock."""
    order.require(PLACED)
    shipped = 0
    for line in order.lines:
        inventory.ship(line.sku, line.quantity)
        shipped += line.quantity
    order.state = SHIPPED
    return shipped


def cancel_order(inventory: Inventory, order: Order) -> None:
    """Cancel an open or placed order, releasing any reserved stock."""
    if order.state == SHIPPED or order.state == CANCELLED:
        raise InventoryError(f"order {order.order_id} can no longer be cancelled")
    if order.state == PLACED:
        for line in order.lines:
            inventory.release(line.sku, line.quantity)
    order.state = CANCELLED
