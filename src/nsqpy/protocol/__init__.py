"""The NSQ wire protocol as data: no sockets, no asyncio, no clocks.

Feed bytes in, get typed values out; give values, get bytes. Used by nsqd, nsqlookupd, the
client and the utilities alike.
"""

from . import commands
from .commands import (
    Command,
    CommandParser,
    LineTooLong,
    as_int64,
    parse_base10,
    parse_mpub_body,
)
from .errors import NON_FATAL_CODES, ProtocolError, go_quote
from .frames import (
    CLOSE_WAIT,
    FRAME_CLOSE_WAIT,
    FRAME_HEARTBEAT,
    FRAME_OK,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V1,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
    encode_error,
    encode_frame,
    encode_response,
    encode_sized,
)
from .lookup import (
    BAD_PROTOCOL,
    BadMagic,
    LookupdInfo,
    LookupRequest,
    LookupServerParser,
    PeerIdentity,
    parse_identify_body,
    parse_identify_response,
)
from .message import (
    MESSAGE_HEADER_LENGTH,
    MSG_ID_LENGTH,
    DecodedMessage,
    MessageDecodeError,
    decode_message,
    encode_message,
)
from .names import is_ephemeral, is_valid_channel_name, is_valid_name, is_valid_topic_name

__all__ = [
    "BAD_PROTOCOL",
    "CLOSE_WAIT",
    "FRAME_CLOSE_WAIT",
    "FRAME_HEARTBEAT",
    "FRAME_OK",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT",
    "MAGIC_V1",
    "MAGIC_V2",
    "MESSAGE_HEADER_LENGTH",
    "MSG_ID_LENGTH",
    "NON_FATAL_CODES",
    "OK",
    "BadMagic",
    "Command",
    "CommandParser",
    "DecodedMessage",
    "Frame",
    "FrameDecoder",
    "LineTooLong",
    "LookupRequest",
    "LookupServerParser",
    "LookupdInfo",
    "MessageDecodeError",
    "PeerIdentity",
    "ProtocolError",
    "as_int64",
    "commands",
    "decode_message",
    "encode_error",
    "encode_frame",
    "encode_message",
    "encode_response",
    "encode_sized",
    "go_quote",
    "is_ephemeral",
    "is_valid_channel_name",
    "is_valid_name",
    "is_valid_topic_name",
    "parse_base10",
    "parse_identify_body",
    "parse_identify_response",
    "parse_mpub_body",
]
