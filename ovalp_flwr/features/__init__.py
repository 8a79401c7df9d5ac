"""Frozen encoders and the verified on-disk cache of their features."""
