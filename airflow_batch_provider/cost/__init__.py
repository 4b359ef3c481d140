"""Cost: token counts, model prices, estimates before submitting and actual cost after merging.

``python -m airflow_batch_provider.cost --help`` is the batch vs real-time decision helper.
"""
