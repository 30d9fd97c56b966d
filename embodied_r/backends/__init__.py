"""Model access shared by perception, the consistency reward and evaluation: the protocol
(``base``), the registry of backend kinds (``registry``) and each backend, model references
(``models``), image encoding, devices and tokens. May import: the core (``paths``) only.
"""
