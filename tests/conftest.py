"""Registers the session-scoped `kube_cluster` fixture (tests/cluster/fixture.py) for every test tier."""

pytest_plugins = ["tests.cluster.fixture"]
