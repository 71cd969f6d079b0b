"""Python stubs generated from proto/liftbridge/api.proto by scripts/gen_proto.py. Never edit by hand."""
