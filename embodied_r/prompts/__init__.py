"""The original repositories' texts, read from a user's own checkout and never shipped.

``locate`` finds a text by its place in the code (a module, a function, the variable it is
assigned to) by parsing the source with ``ast``: nothing of the checkout is run. ``official``
holds the lookup tables of the two papers' repositories and the import; ``store`` the
prompts file it writes under the home (the texts, the checkout's commit, each file's
sha256), the recipe's ``prompts`` section and the settings of the stages a file changes.

May import: the foundation only. ``config`` and ``apps`` import it; no stage package does:
the stages receive the texts as plain strings in their own configs, so the texts are part
of every stage key they change.
"""
