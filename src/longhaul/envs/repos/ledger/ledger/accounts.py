"""Accounts and a ledger of dated transactions.

Days are plain integers (day 0 is whenever the books were started) and all
amounts are integer cents.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LedgerError(Exception):
    """Raised for invalid ledger operations."""


@dataclass(frozen=True)
class Transaction:
    """A signed movement of money: credits are positive, debits negative."""

    day: int
    account: str
    amount_cents: int
    memo: str = ""


@dataclass
class Account:
    """An account that may be overdrawn down to ``-overdraft_limit_cents``."""

    name: str
    overdraft_limit_cents: int = 0
    opened_day: int = 0
    balance_cents: int = 0
    last_day: int = field(default=0, init=False)

    def can_withdraw(self, amount_cents: int) -> bool:
        """True when withdrawing keeps the balance within the overdraft limit."""
        return self.balance_cents - amount_cents >= -self.overdraft_limit_cents


class Ledger:
    """All accounts plus the chronological list of their transactions."""

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}
        self.transactions: list[Transaction] = []

    def open_account(self, name: str, overdraft_limit_cents: int = 0, opened_day: int = 0) -> Account:
        """Create an empty account."""
        if name in self.accounts:
            raise LedgerError(f"account exists: {name}")
        if overdraft_limit_cents < 0:
            raise LedgerError("overdraft limit must not be negative")
        account = Account(name, overdraft_limit_cents, opened_day)
        account.last_day = opened_day
        self.accounts[name] = account
        return account

    def account(self, name: str) -> Account:
        """Return the account called ``name``."""
        if name not in self.accounts:
            raise LedgerError(f"no such account: {name}")
        return self.accounts[name]

    def _check_day(self, account: Account, day: int) -> None:
        if day < account.opened_day:
            raise LedgerError(f"{account.name} was opened on day {account.opened_day}")
        if day < account.last_day:
            raise LedgerError(f"{account.name} already has entries after day {day}")

    def _post(self, name: str, amount_cents: int, day: int, memo: str) -> Transaction:
        account = self.account(name)
        self._check_day(account, day)
        transaction = Transaction(day, name, amount_cents, memo)
        self.transactions.append(transaction)
        account.balance_cents += amount_cents
        account.last_day = day
        return transaction

    def deposit(self, name: str, amount_cents: int, day: int, memo: str = "deposit") -> Transaction:
        """Credit a positive amount to ``name``."""
        if amount_cents <= 0:
            raise LedgerError("deposit must be positive")
        return self._post(name, amount_cents, day, memo)

    def withdraw(self, name: str, amount_cents: int, day: int, memo: str = "withdrawal") -> Transaction:
        """Debit a positive amount from ``name`` if its overdraft limit allows it."""
        if amount_cents <= 0:
            raise LedgerError("withdrawal must be positive")
        if not self.account(name).can_withdraw(amount_cents):
            raise LedgerError(f"insufficient funds in {name}")
        return self._post(name, -amount_cents, day, memo)

    def transfer(self, source: str, target: str, amount_cents: int, day: int) -> Transaction:
        """Move money between two accounts; nothing is posted if either side fails."""
        if source == target:
            raise LedgerError("cannot transfer to the same account")
        self._check_day(self.account(target), day)
        debit = self.withdraw(source, amount_cents, day, f"transfer to {target}")
        self.deposit(target, amount_cents, day, f"transfer from {source}")
        return debit

    def balance(self, name: str, day: int | None = None) -> int:
        """Balance of ``name`` now, or at the end of ``day``."""
        account = self.account(name)
        if day is None:
            return account.balance_cents
        total = 0
        for transaction in self.transactions:
            if transaction.account == name and transaction.day <= day:
                total += transaction.amount_cents
        return total

    def history(self, name: str, start_day: int | None = None, end_day: int | None = None) -> list[Transaction]:
        """Transactions of ``name`` between ``start_day`` and ``end_day`` inclusive."""
        self.account(name)
        result = []
        for transaction in self.transactions:
            if transaction.account != name:
                continue
            if start_day is not None and transaction.day < start_day:
                continue
            if end_day is not None and transaction.day > end_day:
                continue
            result.append(transaction)
        return result

    def total_cents(self) -> int:
        """Sum of all account balances."""
        return sum(account.balance_cents for account in self.accounts.values())

    def accounts_below(self, threshold_cents: int = 0) -> list[str]:
        """Sorted names of accounts whose balance is under ``threshold_cents``."""
        return sorted(name for name, acc in self.accounts.items() if acc.balance_cents < threshold_cents)
