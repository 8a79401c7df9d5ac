"""Launchers and deployments: flwr run, local SuperLink + SuperNodes, certificates."""
