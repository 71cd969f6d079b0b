"""Publishing Spark DataFrames from the executors, and the liftbridge data source."""
