"""The key-frame stage: decoding, the overlap rule (and the official one), the cache by video
content and the resumable stage over a catalog. May import: the core.
"""
