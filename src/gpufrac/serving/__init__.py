"""Serving models: the replica server, the request gateway, deployments and their autoscaler."""
