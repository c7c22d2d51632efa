import pytest
from inventory import Inventory, InventoryError, Item


def test_item_defaults():
    item = Item("A1", "Widget", 250)
    assert item.quantity == 0
    assert item.reorder_level == 5
    assert item.reorder_quantity == 20
    assert item.value_cents == 0


def test_item_value_cents():
    assert Item("A1", "Widget", 250, quantity=4).value_cents == 1000
    assert Item("A2", "Gadget", 199, quantity=3).value_cents == 597


def test_item_validation():
    with pytest.raises(InventoryError):
        Item("  ", "Blank", 100)
    with pytest.raises(InventoryError):
        Item("A1", "Widget", -1)
    with pytest.raises(InventoryError):
        Item("A1", "Widget", 100, quantity=-1)
    with pytest.raises(InventoryError):
        Item("A1", "Widget", 100, quantity=3, reorder_level=-1)
    free = Item("F1", "Freebie", 0, quantity=0, reorder_level=0)
    assert free.price_cents == 0
    assert free.sku == "F1"


def test_needs_restock_boundary():
    assert Item("A1", "Widget", 100, quantity=5).needs_restock() is True
    assert Item("A1", "Widget", 100, quantity=6).needs_restock() is False
    assert Item("A1", "Widget", 100, quantity=2, reorder_level=1).needs_restock() is False
    assert Item("A1", "Widget", 100, quantity=1, reorder_level=1).needs_restock() is True


def test_add_get_len_contains():
    inv = Inventory()
    assert len(inv) == 0
    inv.add(Item("A1", "Widget", 100, quantity=3))
    inv.add(Item("B2", "Bolt", 5, quantity=100))
    assert len(inv) == 2
    assert "A1" in inv
    assert "ZZ" not in inv
    assert inv.get("B2").name == "Bolt"
    with pytest.raises(InventoryError):
        inv.get("ZZ")


def test_add_duplicate_sku_rejected():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100))
    with pytest.raises(InventoryError):
        inv.add(Item("A1", "Other", 200))
    assert inv.get("A1").name == "Widget"


def test_new_item_has_nothing_reserved():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=7))
    assert inv.reserved("A1") == 0
    assert inv.available("A1") == 7
    with pytest.raises(InventoryError):
        inv.reserved("nope")


def test_remove_item():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=3))
    removed = inv.remove("A1")
    assert removed.sku == "A1"
    assert "A1" not in inv
    assert len(inv) == 0
    with pytest.raises(InventoryError):
        inv.remove("A1")


def test_remove_item_with_reservation_fails():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=3))
    inv.reserve("A1", 1)
    with pytest.raises(InventoryError):
        inv.remove("A1")
    inv.release("A1", 1)
    assert inv.remove("A1").name == "Widget"


def test_receive():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=3))
    assert inv.receive("A1", 4) == 7
    assert inv.get("A1").quantity == 7
    assert inv.receive("A1", 1) == 8
    with pytest.raises(InventoryError):
        inv.receive("A1", 0)
    with pytest.raises(InventoryError):
        inv.receive("A1", -2)


def test_reserve_updates_availability():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=10))
    assert inv.reserve("A1", 3) == 7
    assert inv.reserved("A1") == 3
    assert inv.available("A1") == 7
    assert inv.get("A1").quantity == 10


def test_reserve_exactly_available_then_more_fails():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=4))
    assert inv.reserve("A1", 4) == 0
    with pytest.raises(InventoryError):
        inv.reserve("A1", 1)
    with pytest.raises(InventoryError):
        inv.reserve("A1", 0)


def test_reserve_too_many_fails():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=4))
    with pytest.raises(InventoryError):
        inv.reserve("A1", 5)
    assert inv.reserved("A1") == 0


def test_release():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=10))
    inv.reserve("A1", 6)
    inv.release("A1", 2)
    assert inv.reserved("A1") == 4
    with pytest.raises(InventoryError):
        inv.release("A1", 5)
    with pytest.raises(InventoryError):
        inv.release("A1", 0)
    inv.release("A1", 4)
    assert inv.reserved("A1") == 0
    assert inv.available("A1") == 10


def test_ship():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=10))
    inv.reserve("A1", 6)
    inv.ship("A1", 4)
    assert inv.get("A1").quantity == 6
    assert inv.reserved("A1") == 2
    assert inv.available("A1") == 4
    with pytest.raises(InventoryError):
        inv.ship("A1", 3)
    with pytest.raises(InventoryError):
        inv.ship("A1", 0)
    inv.ship("A1", 1)
    inv.ship("A1", 1)
    assert inv.get("A1").quantity == 4
    assert inv.reserved("A1") == 0


def test_total_value():
    inv = Inventory()
    assert inv.total_value_cents() == 0
    inv.add(Item("A1", "Widget", 250, quantity=4))
    inv.add(Item("B2", "Bolt", 3, quantity=7))
    assert inv.total_value_cents() == 1021


def test_low_stock_sorted():
    inv = Inventory()
    inv.add(Item("C3", "Cog", 10, quantity=5))
    inv.add(Item("A1", "Widget", 10, quantity=0))
    inv.add(Item("B2", "Bolt", 10, quantity=6))
    inv.add(Item("D4", "Dowel", 10, quantity=9, reorder_level=10))
    assert inv.low_stock() == ["A1", "C3", "D4"]


def test_restock_plan_without_budget():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 100, quantity=2))
    inv.add(Item("B2", "Bolt", 10, quantity=30))
    inv.add(Item("C3", "Cog", 0, quantity=0, reorder_level=3, reorder_quantity=4))
    assert inv.restock_plan() == {"A1": 23, "C3": 7}


def test_restock_plan_with_budget_serves_most_urgent_first():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 300, quantity=0, reorder_level=2, reorder_quantity=8))
    inv.add(Item("B2", "Bolt", 100, quantity=1, reorder_level=10, reorder_quantity=5))
    # B2 is 9 below its level, A1 only 2, so B2 is bought first.
    plan = inv.restock_plan(budget_cents=2050)
    assert plan == {"B2": 14, "A1": 2}
    assert list(plan) == ["B2", "A1"]


def test_restock_plan_budget_exhausted_skips_items():
    inv = Inventory()
    inv.add(Item("A1", "Widget", 300, quantity=0, reorder_level=2, reorder_quantity=8))
    inv.add(Item("B2", "Bolt", 100, quantity=1, reorder_level=10, reorder_quantity=5))
    assert inv.restock_plan(budget_cents=1450) == {"B2": 14}
    assert inv.restock_plan(budget_cents=99) == {}


def test_restock_plan_ties_broken_by_sku_and_free_items():
    inv = Inventory()
    inv.add(Item("B2", "Bolt", 100, quantity=0, reorder_level=1, reorder_quantity=3))
    inv.add(Item("A1", "Widget", 100, quantity=1, reorder_level=2, reorder_quantity=3))
    inv.add(Item("Z9", "Sticker", 0, quantity=0, reorder_level=0, reorder_quantity=2))
    plan = inv.restock_plan(budget_cents=550)
    assert plan == {"A1": 4, "B2": 1, "Z9": 2}
    assert list(plan) == ["A1", "B2", "Z9"]


def test_restock_plan_budget_applies_to_one_cent_items():
    inv = Inventory()
    inv.add(Item("P1", "Pin", 1, quantity=0, reorder_level=5, reorder_quantity=5))
    assert inv.restock_plan(budget_cents=7) == {"P1": 7}
    assert inv.restock_plan() == {"P1": 10}
