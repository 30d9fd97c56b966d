"""MLflow: the store a run names and whether it answers (``store``), the link that rides out a
server away (``link``, ``outbox``), runs and their names (``runs``, ``names``), and the recorder
of a pipeline run (``record``). May import: the foundation modules only; all may import it.
"""
