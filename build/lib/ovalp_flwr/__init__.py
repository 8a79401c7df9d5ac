"""OvA-LP on Flower: one-vs-all linear probing of frozen encoder features under non-IID FL."""

__version__ = "0.1.0"
