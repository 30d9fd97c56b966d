"""What exists only for the demo and smoke recipes and the tests: the world perceiver, the scripted
reader (``ceiling``) and the ``tiny:<name>`` models; the method's packages reach it by module name only.
May import: the core, ``backends``, ``synthetic``, ``perception``, ``scoring``, ``training`` and
``interactive`` (the texts the tiny reasoners' tokenizers keep whole)."""
