"""Resilient Liftbridge client, sync and asyncio. Imports neither Airflow nor PySpark."""
