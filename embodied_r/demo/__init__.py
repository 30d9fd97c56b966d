"""What exists only for the embedded default (the ``demo`` and ``smoke`` recipes and the tests):

- the stand-in perceiver that reports the synthetic world's truth (``world_perceiver``,
  backend ``kind: world``);
- the scripted reader that answers the test questions from the perception text alone
  (``ceiling``);
- the tiny models recipes name as ``tiny:<name>``: their table and resolver (``models``), the
  random-weight Qwen2 and Qwen2.5-VL builders (``tiny_models``: ``tiny:lm``, ``tiny:vlm``) and
  the demo's reasoner, whose tokenizer is built for the policy's prompts (``tiny_reasoner``:
  ``tiny:lm-reasoner``), and the Embodied-Reasoner demo's agent, a tiny VLM whose tokenizer is
  built for the agent's turns (``tiny_vlm_reasoner``: ``tiny:vlm-reasoner``).

The method's packages never import this package, neither to use it nor to register anything
in theirs: the backends' factory reaches the world perceiver, and ``backends.models`` the
tiny models' table, by module name when a recipe names them (a stage whose recipe names one
hashes its module, ``runners`` reading the backends' ``BY_NAME`` tables and this package's).

May import: the core, ``backends``, ``synthetic``, ``perception``, ``scoring`` and ``training``
(the prompt texts the tiny reasoner's tokenizer keeps whole), and ``interactive`` (the agent's
texts and object types the tiny VLM reasoner's tokenizer keeps whole).
"""
