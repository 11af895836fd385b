"""Message classes of onnx.proto in descriptor pools of their own: mirrors of ``onnx.ModelProto``
whose schema differs (string fields validated as UTF-8, types kept as bytes) to parse the same bytes
another way (:func:`fixer.model_io._utf8_mirror`, :func:`fixer.shapes._vi_mirror`).
"""

from __future__ import annotations

import onnx


def onnx_schema():
    """A copy of the ``onnx.proto`` file descriptor (to derive a mirror schema from) and the prefix
    ``.<package>.`` of its message type names."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    onnx.ModelProto.DESCRIPTOR.file.CopyToProto(fdp)
    return fdp, "." + fdp.package + "."


def model_class(fdp):
    """The ``ModelProto`` message class of the schema ``fdp``, in a descriptor pool of its own."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(fdp.package + ".ModelProto"))
