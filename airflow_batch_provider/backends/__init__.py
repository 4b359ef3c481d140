"""Batch backends: one package per provider, each owning everything that provider is.

A backend is a :class:`~airflow_batch_provider.backends.base.Backend` subclass registered in the
``airflow_batch_provider.backends`` entry-point group (see :mod:`.registry` and docs/backends.md).
The pipeline stages ask the registry for a backend by name and call only what the base declares.
"""
