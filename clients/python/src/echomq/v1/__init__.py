"""Generated protobuf and gRPC stubs of the `echomq.v1` API (from proto/echomq/v1).

Do not edit the `*_pb2*` modules: regenerate them with `scripts/generate_stubs.py`.
"""
