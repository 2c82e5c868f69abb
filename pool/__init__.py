"""The RemotePool: a stateless gRPC server keeping fenced, incremental checkpoints in an object store."""
