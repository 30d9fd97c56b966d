"""Embodied-R: spatial reasoning over egocentric video."""

__version__ = "0.1.0"
