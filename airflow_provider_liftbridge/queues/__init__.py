"""Queue providers for the common.messaging provider (``MessageQueueTrigger``)."""
