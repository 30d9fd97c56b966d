"""The benchmarks: one module each (its files, source schema, tasks, answer rules, hub repo,
reader and synthetic twin), ``base`` what they share, ``registry`` the ordered list of them.

May import: the foundation only, and nothing heavy at import (a recipe's config reads them).
"""
