"""CSV export and import of transactions (in-memory text only)."""

from __future__ import annotations

import csv
import io

from .accounts import Ledger, LedgerError, Transaction

FIELDS = ["day", "account", "amount", "memo"]


def format_amount(cents: int) -> str:
    """Format cents as a plain decimal string such as ``-12.05``."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole}.{frac:02d}"


def parse_amount(text: str) -> int:
    """Parse ``"12.5"``, ``"-0.07"`` or ``"3"`` into integer cents."""
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    digits = text[1:] if text[:1] in "+-" else text
    whole, dot, frac = digits.partition(".")
    if not whole.isdigit() or len(frac) > 2 or (dot and not frac.isdigit()):
        raise ValueError(f"invalid amount: {text!r}")
    return sign * (int(whole) * 100 + int(frac.ljust(2, "0")))


def export_csv(transactions: list[Transaction]) -> str:
    """Serialise transactions to CSV text with a header row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(FIELDS)
    for transaction in transactions:
        writer.writerow([transaction.day, transaction.account, format_amount(transaction.amount_cents), transaction.memo])
    return buffer.getvalue()


def import_csv(text: str) -> list[Transaction]:
    """Parse CSV text produced by :func:`export_csv`; blank lines are skipped.

    Errors mention the 1-based line number of the offending row.
    """
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [cell.strip().lower() for cell in rows[0]] != FIELDS:
        raise LedgerError("missing or invalid header")
    transactions = []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(FIELDS):
            raise LedgerError(f"line {number}: expected {len(FIELDS)} fields, got {len(row)}")
        try:
            day = int(row[0])
            amount = parse_amount(row[2])
        except ValueError as exc:
            raise LedgerError(f"line {number}: {exc}") from None
        transactions.append(Transaction(day, row[1].strip(), amount, row[3]))
    return transactions


def replay(ledger: Ledger, transactions: list[Transaction]) -> int:
    """Post transactions into ``ledger``, opening unknown accounts on first use.

    Zero-amount rows are ignored. Returns the number of transactions posted.
    """
    posted = 0
    for transaction in transactions:
        if transaction.account not in ledger.accounts:
            ledger.open_account(transaction.account, opened_day=transaction.day)
        if transaction.amount_cents > 0:
            ledger.deposit(transaction.account, transaction.amount_cents, transaction.day, transaction.memo)
        elif transaction.amount_cents < 0:
            ledger.withdraw(transaction.account, -transaction.amount_cents, transaction.day, transaction.memo)
        else:
            continue
        posted += 1
    return posted
