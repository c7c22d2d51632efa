"""The benchmark scripts, and the packages they share (`benchmarks.sim`), importable from the
repository root (as the tests do)."""
