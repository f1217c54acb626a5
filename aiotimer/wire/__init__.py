"""The wire codec: FIFO lines in, requests out; requests in, lines out. Pure: no I/O.

The format, its limits and the validation of a :class:`Request` are in
:mod:`aiotimer.wire._request`, decoding a byte stream (:class:`LineDecoder`) in
:mod:`aiotimer.wire._decoder`, encoding (:func:`encode`) in :mod:`aiotimer.wire._encoder`;
this module is the one the rest of the package imports them from. Each name is loaded on
first use: a worker, which only encodes, never loads the decoder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiotimer._faces import face_getattr

if TYPE_CHECKING:
    from aiotimer.wire._decoder import Decoded, LineDecoder, Rejection
    from aiotimer.wire._dumpfile import (
        DEFAULT_DUMP_SIGNAL,
        END_MARKER,
        ENV_DUMP_DIR,
        FAULT_THREAD_HEADER,
        HEADER_TAG,
        MAX_DUMP_BYTES,
        SPY_THREAD_HEADER,
        dump_dir_for,
        dump_path_for,
    )
    from aiotimer.wire._encoder import BlockEncoder, block_encoder, encode, fits_block_encoder
    from aiotimer.wire._learned import Learned, learned, learned_problem
    from aiotimer.wire._mentions import mentions_end, scanned, split_junk, take_due
    from aiotimer.wire._request import (
        ENV_FIFO,
        JOB_CONTROL_SIGNALS,
        MARKER_SUFFIX,
        MAX_LINE_BYTES,
        MAX_SCOPE_ID_LENGTH,
        MAX_SIGNAL,
        MAX_START_TIME,
        PIPE_BUF,
        PROTOCOL_VERSION,
        REAP_SIGNALS,
        TORCH_ENV_FIFO,
        Request,
        RequestTooLargeError,
        check_block,
        number_problem,
        scope_id_problem,
        signal_problem,
        validate,
    )

_LAZY: Final[dict[str, str]] = {
    "DEFAULT_DUMP_SIGNAL": "aiotimer.wire._dumpfile",
    "END_MARKER": "aiotimer.wire._dumpfile",
    "ENV_DUMP_DIR": "aiotimer.wire._dumpfile",
    "FAULT_THREAD_HEADER": "aiotimer.wire._dumpfile",
    "HEADER_TAG": "aiotimer.wire._dumpfile",
    "MAX_DUMP_BYTES": "aiotimer.wire._dumpfile",
    "SPY_THREAD_HEADER": "aiotimer.wire._dumpfile",
    "dump_dir_for": "aiotimer.wire._dumpfile",
    "dump_path_for": "aiotimer.wire._dumpfile",
    "fits_block_encoder": "aiotimer.wire._encoder",
    "mentions_end": "aiotimer.wire._mentions",
    "scanned": "aiotimer.wire._mentions",
    "split_junk": "aiotimer.wire._mentions",
    "take_due": "aiotimer.wire._mentions",
    "Decoded": "aiotimer.wire._decoder",
    "LineDecoder": "aiotimer.wire._decoder",
    "Rejection": "aiotimer.wire._decoder",
    "BlockEncoder": "aiotimer.wire._encoder",
    "block_encoder": "aiotimer.wire._encoder",
    "encode": "aiotimer.wire._encoder",
    "Learned": "aiotimer.wire._learned",
    "learned": "aiotimer.wire._learned",
    "learned_problem": "aiotimer.wire._learned",
    "ENV_FIFO": "aiotimer.wire._request",
    "JOB_CONTROL_SIGNALS": "aiotimer.wire._request",
    "MARKER_SUFFIX": "aiotimer.wire._request",
    "MAX_LINE_BYTES": "aiotimer.wire._request",
    "MAX_SCOPE_ID_LENGTH": "aiotimer.wire._request",
    "MAX_SIGNAL": "aiotimer.wire._request",
    "MAX_START_TIME": "aiotimer.wire._request",
    "PIPE_BUF": "aiotimer.wire._request",
    "PROTOCOL_VERSION": "aiotimer.wire._request",
    "REAP_SIGNALS": "aiotimer.wire._request",
    "TORCH_ENV_FIFO": "aiotimer.wire._request",
    "Request": "aiotimer.wire._request",
    "RequestTooLargeError": "aiotimer.wire._request",
    "check_block": "aiotimer.wire._request",
    "number_problem": "aiotimer.wire._request",
    "scope_id_problem": "aiotimer.wire._request",
    "signal_problem": "aiotimer.wire._request",
    "validate": "aiotimer.wire._request",
}

__getattr__, __dir__ = face_getattr("aiotimer.wire", globals(), lazy=_LAZY)

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "END_MARKER",
    "ENV_DUMP_DIR",
    "ENV_FIFO",
    "FAULT_THREAD_HEADER",
    "HEADER_TAG",
    "JOB_CONTROL_SIGNALS",
    "MARKER_SUFFIX",
    "MAX_DUMP_BYTES",
    "MAX_LINE_BYTES",
    "MAX_SCOPE_ID_LENGTH",
    "MAX_SIGNAL",
    "MAX_START_TIME",
    "PIPE_BUF",
    "PROTOCOL_VERSION",
    "REAP_SIGNALS",
    "SPY_THREAD_HEADER",
    "TORCH_ENV_FIFO",
    "BlockEncoder",
    "Decoded",
    "Learned",
    "LineDecoder",
    "Rejection",
    "Request",
    "RequestTooLargeError",
    "block_encoder",
    "check_block",
    "dump_dir_for",
    "dump_path_for",
    "encode",
    "fits_block_encoder",
    "learned",
    "learned_problem",
    "mentions_end",
    "number_problem",
    "scanned",
    "scope_id_problem",
    "signal_problem",
    "split_junk",
    "take_due",
    "validate",
]
