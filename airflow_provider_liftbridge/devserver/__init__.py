"""A Liftbridge-compatible server (gRPC API on a real nats-server) for local work and tests."""
