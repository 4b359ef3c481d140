"""The "LLM batches" view in the Airflow UI: a plugin (:mod:`.plugin`) serving pages of what the package records."""
