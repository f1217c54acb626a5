"""The wire codec: FIFO lines in, requests out; requests in, lines out. Pure: no I/O.

The format, its limits and the validation of a :class:`Request` are in
:mod:`aiotimer.wire._request`, decoding a byte stream in :mod:`aiotimer.wire._decoder`, encoding in
:mod:`aiotimer.wire._encoder`; this module is the one the rest of the package imports them
from.
"""

from __future__ import annotations

from aiotimer.wire._decoder import Decoded, LineDecoder, Rejection
from aiotimer.wire._encoder import BlockEncoder, block_encoder, encode
from aiotimer.wire._request import (
    ENV_FIFO,
    MARKER_SUFFIX,
    MAX_LINE_BYTES,
    MAX_SCOPE_ID_LENGTH,
    MAX_SIGNAL,
    MAX_START_TIME,
    PIPE_BUF,
    PROTOCOL_VERSION,
    TORCH_ENV_FIFO,
    Request,
    RequestTooLargeError,
    check_block,
    number_problem,
    scope_id_problem,
    signal_problem,
    validate,
)

__all__ = [
    "ENV_FIFO",
    "MARKER_SUFFIX",
    "MAX_LINE_BYTES",
    "MAX_SCOPE_ID_LENGTH",
    "MAX_SIGNAL",
    "MAX_START_TIME",
    "PIPE_BUF",
    "PROTOCOL_VERSION",
    "TORCH_ENV_FIFO",
    "BlockEncoder",
    "Decoded",
    "LineDecoder",
    "Rejection",
    "Request",
    "RequestTooLargeError",
    "block_encoder",
    "check_block",
    "encode",
    "number_problem",
    "scope_id_problem",
    "signal_problem",
    "validate",
]
