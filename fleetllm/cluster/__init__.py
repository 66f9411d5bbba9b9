"""Cluster bootstrap and Kubernetes manifests."""
