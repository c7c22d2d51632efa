import pytest
from inventory import (
    CANCELLED,
    OPEN,
    PLACED,
    SHIPPED,
    Inventory,
    InventoryError,
    Item,
    Order,
    OrderLine,
    cancel_order,
    place_order,
    ship_order,
    shipping_cents,
)


def test_order_line_totals():
    line = OrderLine("A1", 12, 250)
    assert line.gross_cents == 3000
    assert line.net_cents == 2850
    small = OrderLine("B2", 3, 199)
    assert small.gross_cents == 597
    assert small.net_cents == 597


def test_new_order_defaults():
    order = Order("o1")
    assert order.state == OPEN
    assert order.coupon_percent == 0
    assert order.tax_rate == 8.0
    assert order.lines == []
    assert order.item_count == 0
    assert order.total_cents() == 0


def test_coupon_limits():
    assert Order("o1", coupon_percent=50).coupon_percent == 50
    with pytest.raises(InventoryError):
        Order("o1", coupon_percent=51)
    with pytest.raises(InventoryError):
        Order("o1", coupon_percent=50.5)
    with pytest.raises(InventoryError):
        Order("o1", coupon_percent=-1)


def test_add_line_merges_same_sku_and_price():
    order = Order("o1")
    first = order.add_line("A1", 2, 500)
    second = order.add_line("A1", 3, 500)
    assert first is second
    assert len(order.lines) == 1
    assert order.lines[0].quantity == 5
    assert order.item_count == 5


def test_add_line_keeps_different_prices_and_skus_apart():
    order = Order("o1")
    order.add_line("A1", 2, 500)
    order.add_line("A1", 1, 450)
    order.add_line("B2", 4, 500)
    assert [(ln.sku, ln.quantity, ln.unit_cents) for ln in order.lines] == [
        ("A1", 2, 500),
        ("A1", 1, 450),
        ("B2", 4, 500),
    ]
    assert order.item_count == 7


def test_add_line_rejects_non_positive_quantity():
    order = Order("o1")
    with pytest.raises(InventoryError):
        order.add_line("A1", 0, 500)
    with pytest.raises(InventoryError):
        order.add_line("A1", -3, 500)
    assert order.lines == []


def test_remove_line_whole_and_partial():
    order = Order("o1")
    order.add_line("A1", 5, 100)
    order.add_line("B2", 2, 100)
    order.remove_line("A1", 2)
    assert order.lines[0].quantity == 3
    order.remove_line("A1", 3)
    assert [ln.sku for ln in order.lines] == ["B2"]
    order.remove_line("B2")
    assert order.lines == []


def test_remove_line_more_than_present_drops_line():
    order = Order("o1")
    order.add_line("A1", 2, 100)
    order.add_line("B2", 1, 100)
    order.remove_line("B2", 9)
    assert [ln.sku for ln in order.lines] == ["A1"]
    with pytest.raises(InventoryError):
        order.remove_line("ZZ")


def test_order_totals_with_coupon_and_bulk_discount():
    order = Order("o7", coupon_percent=10)
    order.add_line("A1", 12, 250)
    order.add_line("B2", 3, 199)
    assert order.subtotal_cents() == 3447
    assert order.coupon_cents() == 345
    assert order.total_cents() == 3350


def test_order_total_default_tax():
    order = Order("o1")
    order.add_line("A1", 2, 500)
    assert order.subtotal_cents() == 1000
    assert order.coupon_cents() == 0
    assert order.total_cents() == 1080


def test_order_total_custom_tax():
    order = Order("o1", coupon_percent=25, tax_rate=0)
    order.add_line("A1", 4, 100)
    assert order.total_cents() == 300
    taxed = Order("o2", tax_rate=5)
    taxed.add_line("A1", 1, 1000)
    assert taxed.total_cents() == 1050


def test_shipping_defaults():
    assert shipping_cents(4999, 1) == 499
    assert shipping_cents(5000, 1) == 0
    assert shipping_cents(1000, 3) == 599
    assert shipping_cents(1000, 0) == 0
    assert shipping_cents(0, 0) == 0


def test_shipping_custom_parameters():
    assert shipping_cents(100, 1, 50) == 0
    assert shipping_cents(100, 2, 200, 300) == 350
    assert shipping_cents(100, 4, 200, 300, 10) == 330


def test_place_order_reserves_stock():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    inv.add(Item("B2", "Bolt", 20, quantity=4))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    order.add_line("B2", 4, 20)
    place_order(inv, order)
    assert order.state == PLACED
    assert inv.reserved("A1") == 3
    assert inv.available("A1") == 7
    assert inv.available("B2") == 0


def test_place_order_combines_lines_of_same_sku():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=5))
    order = Order("o1")
    order.add_line("A1", 2, 500)
    order.add_line("A1", 3, 450)
    place_order(inv, order)
    assert inv.reserved("A1") == 5


def test_place_order_is_all_or_nothing():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    inv.add(Item("B2", "Bolt", 20, quantity=1))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    order.add_line("B2", 2, 20)
    with pytest.raises(InventoryError):
        place_order(inv, order)
    assert order.state == OPEN
    assert inv.reserved("A1") == 0
    assert inv.reserved("B2") == 0


def test_place_order_requires_open_non_empty_order():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    with pytest.raises(InventoryError):
        place_order(inv, Order("empty"))
    order = Order("o1")
    order.add_line("A1", 1, 500)
    place_order(inv, order)
    with pytest.raises(InventoryError):
        place_order(inv, order)
    with pytest.raises(InventoryError):
        order.add_line("A1", 1, 500)
    with pytest.raises(InventoryError):
        order.remove_line("A1")
    assert inv.reserved("A1") == 1


def test_ship_order():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    inv.add(Item("B2", "Bolt", 20, quantity=6))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    order.add_line("B2", 2, 20)
    with pytest.raises(InventoryError):
        ship_order(inv, order)
    place_order(inv, order)
    assert ship_order(inv, order) == 5
    assert order.state == SHIPPED
    assert inv.get("A1").quantity == 7
    assert inv.get("B2").quantity == 4
    assert inv.reserved("A1") == 0


def test_cancel_open_order():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    cancel_order(inv, order)
    assert order.state == CANCELLED
    assert inv.available("A1") == 10
    with pytest.raises(InventoryError):
        cancel_order(inv, order)


def test_cancel_placed_order_releases_stock():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    place_order(inv, order)
    cancel_order(inv, order)
    assert order.state == CANCELLED
    assert inv.reserved("A1") == 0
    assert inv.available("A1") == 10


def test_cannot_cancel_shipped_order():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 500, quantity=10))
    order = Order("o1")
    order.add_line("A1", 3, 500)
    place_order(inv, order)
    ship_order(inv, order)
    with pytest.raises(InventoryError):
        cancel_order(inv, order)
    assert order.state == SHIPPED
