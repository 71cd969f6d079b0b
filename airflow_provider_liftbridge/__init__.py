"""Apache Airflow provider for Liftbridge, the durable stream log on NATS.

Rooms: ``codec`` (NATS envelope), ``client`` (sync + asyncio client), ``hooks``,
``operators``, ``sensors``, ``triggers``, ``spark`` and ``devserver``.
"""

__version__ = "0.1.0"
