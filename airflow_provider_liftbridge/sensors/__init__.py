"""Sensors waiting on offsets, acks and messages; all deferrable."""
