"""Prefect tasks: thin wrappers that run one library stage each."""
