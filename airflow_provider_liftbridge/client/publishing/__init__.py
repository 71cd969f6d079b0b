"""Publishing, by what is sent and how.

- :mod:`.single`: one message over gRPC (``publish``, ``publish_to_subject``).
- :mod:`.batch`: ``publish_many``, the one batch publisher: chooses the path (NATS-direct or gRPC
  PublishAsync) and partitions, and reports the acks.
- :mod:`.grpc_engine`: a batch over gRPC PublishAsync, pipelined.
- :mod:`.nats_engine`: a batch as enveloped messages straight to NATS, acks on an ack inbox.
- the NATS connection and the transports are in :mod:`..transport`.
- :mod:`.resend`: whether a record without an ack is sent again.
- :mod:`.nats_publisher`: a standalone NATS publisher for code that holds only a NATS URL.
"""
