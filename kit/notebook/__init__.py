"""The IPython skin: `%%distributed` and `%dist`, thin wrappers over `kit.engine.cluster.Cluster`."""
