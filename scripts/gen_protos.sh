#!/usr/bin/env bash
# Regenerate protos/*_pb2*.py and .pyi from protos/remote_pool.proto; CI runs this and fails on drift.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/remote_pool.proto
