"""Drivers that compose rollouts, scoring and the trainer into a run. For now the
synchronous local loop (`sync`); the async/Ray runtime of a later issue joins it here."""
