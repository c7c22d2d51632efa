"""ledger: accounts, transactions, interest and statements in integer cents."""

from .accounts import Account, Ledger, LedgerError, Transaction
from .csvio import FIELDS, export_csv, format_amount, import_csv, parse_amount, replay
from .interest import (
    accrue_daily,
    amortization_schedule,
    basis_points,
    compound_balance,
    div_round,
    monthly_payment,
    simple_interest,
)
from .statements import (
    Statement,
    StatementLine,
    build_statement,
    daily_balances,
    maintenance_fee,
    render,
)

__all__ = [
    "FIELDS",
    "Account",
    "Ledger",
    "LedgerError",
    "Statement",
    "StatementLine",
    "Transaction",
    "accrue_daily",
    "amortization_schedule",
    "basis_points",
    "build_statement",
    "compound_balance",
    "daily_balances",
    "div_round",
    "export_csv",
    "format_amount",
    "import_csv",
    "maintenance_fee",
    "monthly_payment",
    "parse_amount",
    "render",
    "replay",
    "simple_interest",
]
