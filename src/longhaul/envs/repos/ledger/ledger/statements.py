"""Account statements over a range of days."""

from __future__ import annotations

from dataclasses import dataclass, field

from .accounts import Ledger, LedgerError
from .csvio import format_amount


@dataclass(frozen=True)
class StatementLine:
    day: int
    memo: str
    amount_cents: int
    balance_cents: int


@dataclass
class Statement:
    """Opening balance plus every transaction in ``start_day..end_day``."""

    account: str
    start_day: int
    end_day: int
    opening_cents: int
    lines: list[StatementLine] = field(default_factory=list)

    @property
    def closing_cents(self) -> int:
        return self.lines[-1].balance_cents if self.lines else self.opening_cents

    @property
    def credits_cents(self) -> int:
        return sum(line.amount_cents for line in self.lines if line.amount_cents > 0)

    @property
    def debits_cents(self) -> int:
        """Total money out, as a positive number."""
        return -sum(line.amount_cents for line in self.lines if line.amount_cents < 0)

    def minimum_balance(self) -> int:
        """Lowest balance seen during the period, the opening balance included."""
        lowest = self.opening_cents
        for line in self.lines:
            if line.balance_cents < lowest:
                lowest = line.balance_cents
        return lowest


def build_statement(ledger: Ledger, name: str, start_day: int, end_day: int) -> Statement:
    """Statement of ``name`` for the inclusive day range."""
    if end_day < start_day:
        raise LedgerError("end_day must not precede start_day")
    opening = ledger.balance(name, start_day - 1)
    statement = Statement(name, start_day, end_day, opening)
    running = opening
    for transaction in ledger.history(name, start_day, end_day):
        running += transaction.amount_cents
        statement.lines.append(StatementLine(transaction.day, transaction.memo, transaction.amount_cents, running))
    return statement


def daily_balances(ledger: Ledger, name: str, start_day: int, end_day: int) -> list[int]:
    """End-of-day balances of ``name`` for every day of the inclusive range."""
    running = ledger.balance(name, start_day - 1)
    transactions = ledger.history(name, start_day, end_day)
    balances = []
    index = 0
    for day in range(start_day, end_day + 1):
        while index < len(transactions) and transactions[index].day == day:
            running += transactions[index].amount_cents
            index += 1
        balances.append(running)
    return balances


def maintenance_fee(statement: Statement, fee_cents: int = 500, waive_at_cents: int = 100000) -> int:
    """Monthly fee, waived when the balance never fell below ``waive_at_cents``."""
    return 0 if statement.minimum_balance() >= waive_at_cents else fee_cents


def render(statement: Statement, width: int = 32) -> str:
    """Plain-text statement with amounts right-aligned in a ``width``-wide column."""
    amount_width = 12
    label_width = width - amount_width

    def row(label: str, cents: int) -> str:
        return label[:label_width].ljust(label_width) + format_amount(cents).rjust(amount_width)

    out = [f"{statement.account} days {statement.start_day}-{statement.end_day}"]
    out.append(row("opening", statement.opening_cents))
    for line in statement.lines:
        out.append(row(f"{line.day:>4} {line.memo}", line.amount_cents))
    out.append(row("closing", statement.closing_cents))
    return "\n".join(out)
