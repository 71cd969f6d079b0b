"""What the UI tests hand to the consume operator by dotted path."""

from __future__ import annotations

from airflow_provider_liftbridge.client import Message


def accept(message: Message) -> None:
    """Process nothing; succeed (a value that is not JSON fails before this is called)."""
