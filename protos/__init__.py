"""Generated protobuf and gRPC code for the RemotePool service (see scripts/gen_protos.sh)."""
