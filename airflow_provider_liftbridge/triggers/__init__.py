"""Async triggers that run in the triggerer: offset, ack and message waiters."""
