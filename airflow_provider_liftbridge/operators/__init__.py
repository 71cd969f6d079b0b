"""Operators: stream administration, publishing records and files, publishing Spark outputs,
reading streams (consume, archive to files).

The values the reading operators take are importable from here: the reading modes
(``SinceLastRun``, ``ConsumerGroup``, ``DataInterval``: what ``read=`` reads), ``DeadLetterStream``
(``dead_letters=``) and the archive's file formats (``Parquet``, ``Csv``, ``JsonLines``: ``format=``).
"""

from .archive_formats import Csv, JsonLines, Parquet
from .dead_letters import DeadLetterStream
from .read_modes import ConsumerGroup, DataInterval, SinceLastRun

__all__ = ["ConsumerGroup", "Csv", "DataInterval", "DeadLetterStream", "JsonLines", "Parquet", "SinceLastRun"]
