"""The original repositories' texts, found by their place in a user's own checkout (parsed, never run
or shipped), and the prompts file they are written to.
May import: the foundation only; ``config`` and ``apps`` import it, no stage package does (a stage
gets the texts as plain strings in its config, so they are part of its key)."""
