"""LiftbridgeHook and its async variant for triggers."""
