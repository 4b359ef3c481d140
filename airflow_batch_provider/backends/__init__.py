"""Batch backends that live in one package each (see ``backends/gemini``)."""
