"""inventory: stock items, orders and integer-cent pricing."""

from .items import Inventory, InventoryError, Item
from .orders import (
    CANCELLED,
    OPEN,
    PLACED,
    SHIPPED,
    Order,
    OrderLine,
    cancel_order,
    place_order,
    ship_order,
    shipping_cents,
)
from .pricing import (
    DEFAULT_TIERS,
    add_tax,
    apply_discount,
    bulk_discount_percent,
    format_cents,
    parse_price,
    percent_of,
    split_evenly,
)

__all__ = [
    "CANCELLED",
    "DEFAULT_TIERS",
    "OPEN",
    "PLACED",
    "SHIPPED",
    "Inventory",
    "InventoryError",
    "Item",
    "Order",
    "OrderLine",
    "add_tax",
    "apply_discount",
    "bulk_discount_percent",
    "cancel_order",
    "format_cents",
    "parse_price",
    "percent_of",
    "place_order",
    "ship_order",
    "shipping_cents",
    "split_evenly",
]
