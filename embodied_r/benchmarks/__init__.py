"""The benchmarks: one module each (files, schema, tasks, answer rules, hub repo, reader and
synthetic twin) and their ordered registry. May import: the foundation only, and nothing heavy
at import (a recipe's config reads them).
"""
