"""The bounds a graph model is read under: values, not the server's configuration (the front
ends will make them settings). Every one is checked before the data it bounds is parsed or
copied; passing one is a ``PayloadTooLarge`` whose ``rule`` is the bound's name."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GraphLimits:
    """What one ONNX file may hold.

    ``max_model_bytes``: the file's size, refused before any parsing.
    ``max_nodes``: nodes of the graph (operators, ``Identity`` and ``Constant`` alike).
    ``max_initializers``: initializers and ``Constant`` nodes, the graph's constant tensors.
    ``max_initializer_bytes``: their data, summed over all of them: the larger of the declared
    size (elements times element size) and what the encoding holds in memory once parsed.
    ``max_name_chars``: any name (node, value, graph input or output, dimension parameter).
    ``max_depth``: the longest chain of nodes from a graph input or constant to an output.
    ``max_inputs`` / ``max_outputs``: the graph's inputs and outputs.
    ``max_fields``: protobuf fields the reader looks at before parsing (every node's, attribute's,
    input's and output's fields; packed numbers count one each): it bounds the parse's time and
    memory whatever the encoding, which the byte size alone does not (a million empty strings fit
    in two megabytes and take tens of megabytes once parsed).
    """

    max_model_bytes: int = 64 * MIB
    max_nodes: int = 1024
    max_initializers: int = 256
    max_initializer_bytes: int = 64 * MIB
    max_name_chars: int = 256
    max_depth: int = 256
    max_inputs: int = 64
    max_outputs: int = 64
    max_fields: int = 1 << 16


__all__ = ["GraphLimits"]
