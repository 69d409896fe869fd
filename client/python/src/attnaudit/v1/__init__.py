"""attnaudit.v1: protobuf and gRPC stubs of proto/attnaudit/v1/*.proto.

The *_pb2.py / *_pb2_grpc.py modules are generated from the .proto files
when the package is built (setup.py); they are not in the source tree.
"""
