"""Asynchronous agent jobs: stores (SQLite, Redis Streams), the runner, the routes."""
