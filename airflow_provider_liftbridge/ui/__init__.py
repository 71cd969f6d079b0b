"""The Liftbridge view in the Airflow UI (Airflow 3.1+): an ``AirflowPlugin`` with a FastAPI app
(:mod:`.api`) and an external view pointing at its page; the data is gathered by :mod:`.model`
with the client only. See ``docs/ui.md``."""
