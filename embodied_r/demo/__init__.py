"""What exists only for the embedded default (the ``demo`` recipe): the stand-in perceiver that
reports the synthetic world's truth (``world_perceiver``, backend ``kind: world``) and the
scripted reader that answers the test questions from the perception text alone (``ceiling``).

The method's packages never import this package: the backends' factory reaches the world
perceiver by module name when a recipe asks for it.

May import: the core, ``backends``, ``synthetic``, ``perception``, ``scoring``.
"""
