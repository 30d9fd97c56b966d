"""Prefect flows: the full pipeline and the single-stage reruns."""
