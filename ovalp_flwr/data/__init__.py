"""Datasets by name, partitions of them over clients, label noise, corruptions."""
