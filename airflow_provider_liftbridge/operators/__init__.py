"""Operators: stream administration, publishing records and files, publishing Spark outputs."""
