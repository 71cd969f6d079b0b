"""Dead letters: a message that could not be processed, published to another stream with why.

The dead letter keeps the message's value, key and headers, and adds headers naming the error
and where the message came from (:data:`DEAD_LETTER_HEADERS`), so it can be inspected, fixed and
published back. A dead letter is published and acknowledged before the reader's position moves
past the message: a try that dies in between sends it again on the retry (at-least-once).

Also here: the value formats of the reading operators and their decoding helpers.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import NoSuchStreamError, StreamExistsError
from ..sync_client import LiftbridgeClient
from ..types import AckPolicy, Message

__all__ = [
    "DEAD_LETTER_HEADERS",
    "ERROR_MESSAGE_HEADER",
    "ERROR_TYPE_HEADER",
    "SOURCE_OFFSET_HEADER",
    "SOURCE_PARTITION_HEADER",
    "SOURCE_STREAM_HEADER",
    "VALUE_FORMATS",
    "DeadLetters",
    "NotJsonError",
    "NotTextError",
    "dead_letter_headers",
    "json_value",
    "text_value",
]

#: How the reading operators hand message values over, one set for all of them: ``bytes`` (as
#: stored), ``text`` (decoded as UTF-8), ``json`` (decoded from JSON).
VALUE_FORMATS: tuple[str, ...] = ("bytes", "text", "json")

ERROR_TYPE_HEADER = "dead-letter-error-type"
ERROR_MESSAGE_HEADER = "dead-letter-error"
SOURCE_STREAM_HEADER = "dead-letter-source-stream"
SOURCE_PARTITION_HEADER = "dead-letter-source-partition"
SOURCE_OFFSET_HEADER = "dead-letter-source-offset"
#: The headers a dead letter gets on top of the message's own.
DEAD_LETTER_HEADERS = (
    ERROR_TYPE_HEADER,
    ERROR_MESSAGE_HEADER,
    SOURCE_STREAM_HEADER,
    SOURCE_PARTITION_HEADER,
    SOURCE_OFFSET_HEADER,
)
#: Error texts are cut to this many bytes (a header is no place for a whole traceback).
MAX_ERROR_BYTES = 4096


class NotJsonError(ValueError):
    """A message value is not JSON (the message names the stream, partition and offset)."""


class NotTextError(ValueError):
    """A message value is not UTF-8 text (the message names the stream, partition and offset)."""


def text_value(message: Message) -> str:
    """The message's value decoded as UTF-8.

    :raises NotTextError: it is not UTF-8 (the error names stream, partition, offset).
    """
    try:
        return message.value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotTextError(
            f"the value at stream {message.stream!r} partition {message.partition} offset {message.offset} is not"
            f" UTF-8 text ({exc}); read it with value_format='bytes', or send such messages to a dead-letter stream"
            " (dead_letters=DeadLetterStream(...))"
        ) from None


def json_value(message: Message) -> Any:
    """The message's value decoded as UTF-8 JSON.

    :raises NotJsonError: the value is not UTF-8 JSON (the error names stream, partition, offset).
    """
    try:
        return json.loads(message.value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise NotJsonError(
            f"the value at stream {message.stream!r} partition {message.partition} offset {message.offset} is not"
            f" JSON ({exc}); publish JSON values, read them with value_format='bytes', or send such messages to a"
            " dead-letter stream (dead_letters=DeadLetterStream(...))"
        ) from None


def dead_letter_headers(message: Message, error: BaseException) -> dict[str, bytes]:
    """The message's headers plus the dead-letter headers for ``error``."""
    text = str(error).encode("utf-8", "replace")[:MAX_ERROR_BYTES]
    return dict(message.headers) | {
        ERROR_TYPE_HEADER: type(error).__name__.encode(),
        ERROR_MESSAGE_HEADER: text,
        SOURCE_STREAM_HEADER: message.stream.encode(),
        SOURCE_PARTITION_HEADER: b"%d" % message.partition,
        SOURCE_OFFSET_HEADER: b"%d" % message.offset,
    }


class DeadLetters:
    """Publishes dead letters to ``stream`` with ``client``, each acknowledged before it returns.

    :param client: the client.
    :param stream: the dead-letter stream.
    """

    def __init__(self, client: LiftbridgeClient, stream: str) -> None:
        self.client = client
        self.stream = stream
        self.sent = 0

    def check(self, *, create: bool = False) -> None:
        """Make sure the dead-letter stream exists (creating it with one partition if ``create``).

        :raises NoSuchStreamError: it does not exist and ``create`` is false.
        """
        if self.stream in self.client.fetch_metadata([self.stream]).streams:
            return
        if not create:
            raise NoSuchStreamError(
                f"dead-letter stream {self.stream!r} does not exist: create it, or have it created"
                " (DeadLetterStream(..., create=True))"
            )
        try:
            self.client.create_stream(self.stream, self.stream)
        except StreamExistsError:
            pass  # created meanwhile by a parallel task: fine

    def send(self, message: Message, error: BaseException) -> None:
        """Publish ``message`` with the headers of ``error``; return once acknowledged.

        :raises LiftbridgeError: the dead letter was not acknowledged.
        """
        self.client.publish(
            self.stream,
            message.value,
            key=message.key,
            headers=dead_letter_headers(message, error),
            ack_policy=AckPolicy.LEADER,
        )
        self.sent += 1
