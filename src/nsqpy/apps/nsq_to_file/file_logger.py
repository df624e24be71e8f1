"""One topic's archive file: write, sync, FIN, rotate, move (Go: apps/nsq_to_file/file_logger.go).

Messages are FINished only after the bytes that hold them are fsynced: a batch is synced every
``--sync-interval``, when ``--max-in-flight`` messages wait, or when the consumer is starved
(nsqd would send no more until some are answered). With ``--gzip`` every sync closes the
current gzip member and starts a new one, so a file is a series of complete members.

Unlike Go, a gzip member is kept in memory until its sync and then written in one ``write``:
a process killed between syncs leaves no half member behind, so every file decompresses
(its unsynced messages were not FINished and come again). And a plain file reopened for
appending that does not end with a newline (a run killed mid-write) gets one first, so the torn
record cannot run into the next.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import socket
import struct
import time
import zlib
from typing import Any

from ...client import Consumer, Message
from ...internal import lg
from ...internal.durations import format_duration
from .options import REV_MISSING, Options
from .strftime import DatetimeFormat


class Fatal(Exception):
    """Go's ``logf(lg.FATAL, ...); os.Exit(1)`` inside the file logger."""


def compute_filename_format(opts: Options, topic: str) -> str:
    """The file name template of ``topic``: every token but ``<DATETIME>`` (and ``<REV>`` when
    it is used) replaced (Go: computeFilenameFormat)."""
    hostname = socket.gethostname()
    short_hostname = hostname.split(".")[0]
    identifier = short_hostname
    if opts.host_identifier:
        identifier = opts.host_identifier.replace("<SHORT_HOST>", short_hostname)
        identifier = identifier.replace("<HOSTNAME>", hostname)
    template = opts.filename_format
    if opts.uses_rev:
        if "<REV>" not in template:
            raise ValueError(REV_MISSING)
    else:
        template = template.replace("<REV>", "")
    template = template.replace("<TOPIC>", topic)
    template = template.replace("<HOST>", identifier)
    template = template.replace("<PID>", str(os.getpid()))
    if opts.gzip and not template.endswith(".gz"):
        template += ".gz"
    return template


def go_path_join(*parts: str) -> str:
    """Go's ``path.Join``: join the non-empty parts with ``/`` and clean the result."""
    joined = "/".join(p for p in parts if p)
    return posixpath.normpath(joined) if joined else ""


def rev_name(template: str, rev: int) -> str:
    return template.replace("<REV>", f"-{rev:06d}")


class GzipMember:
    """One gzip member as Go's ``gzip.NewWriterLevel`` writes it (no name, mtime 0, OS 255),
    compressed in memory and handed out whole by :meth:`finish`."""

    __slots__ = ("_buffer", "_compressor", "_crc", "_size")

    def __init__(self, level: int) -> None:
        xfl = 2 if level == 9 else 4 if level == 1 else 0
        self._buffer = bytearray(b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + bytes((xfl, 255)))
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0

    def write(self, data: bytes) -> None:
        self._buffer += self._compressor.compress(data)
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)

    def finish(self) -> bytes:
        self._buffer += self._compressor.flush()
        self._buffer += struct.pack("<II", self._crc, self._size & 0xFFFFFFFF)
        return bytes(self._buffer)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def exclusive_rename(src: str, dst: str) -> None:
    """Move without ever replacing: hard-link then unlink (FileExistsError if dst exists)."""
    os.link(src, dst)
    os.unlink(src)


class FileLogger:
    """Archives one topic: the consumer's handler writes, the router logic syncs and FINs."""

    def __init__(self, opts: Options, topic: str, logger: lg.Logger) -> None:
        self.opts = opts
        self.topic = topic
        self.logger = logger
        self.tag = f"[{topic}/{opts.channel}]"
        self.filename_format = compute_filename_format(opts, topic)
        self.datetime = DatetimeFormat(opts.datetime_format)
        self.consumer: Consumer | None = None
        self.fd: int | None = None
        self.path = ""  # the open file's name (rev substituted)
        self.gzip: GzipMember | None = None
        self.filename = ""  # the current file name template (<DATETIME> rendered)
        self.open_time = 0.0
        self.filesize = 0
        self.rev = 0
        self.pending: list[Message] = []
        self.sync_due = False
        self.close_due = False
        self.stopping = False
        self._ticker: asyncio.Task[None] | None = None
        self._stamp: str | None = None
        self._current = ""

    # ------------------------------------------------------------------ lifecycle

    def start(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        """Go's termChan: stop the ticker, sync, stop the consumer (messages still arriving
        are synced at once), then sync and close the file."""
        if self._ticker is not None:
            self._ticker.cancel()
        self.stopping = True
        self.sync_due = True
        self._settle()
        if self.consumer is not None:
            await self.consumer.close()
        self.sync_due = True
        self.close_due = True
        self._settle()

    def hup(self) -> None:
        """SIGHUP: sync and close; the next message opens the file again (log rotation)."""
        self.sync_due = True
        self.close_due = True
        self._settle()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.opts.sync_interval)
            self._guard(self._on_tick)

    def _on_tick(self) -> None:
        if self.needs_rotation():
            if self.opts.skip_empty_files:
                self.close_due = True
            else:
                self.update_file()
        self.sync_due = True
        self._settle()

    # ------------------------------------------------------------------ messages

    def handle(self, message: Message) -> None:
        """The consumer's handler: write now, FIN after the sync."""
        message.disable_auto_response()
        self._guard(self._write_message, message)

    def _write_message(self, message: Message) -> None:
        if self.needs_rotation():
            self.update_file()
            self.sync_due = True
        self.write(message.body + b"\n")
        self.pending.append(message)
        if len(self.pending) >= self.opts.max_in_flight or self.stopping:
            self.sync_due = True
        self._settle()

    def _settle(self) -> None:
        """The end of Go's router loop round: sync and FIN if due, close if asked."""
        starved = self.consumer is not None and self.consumer.is_starved()
        if self.sync_due or starved:
            if self.pending:
                count = len(self.pending)
                self.logger.info(f"{self.tag} syncing {count} records to disk")
                try:
                    self.sync()
                except OSError as exc:
                    raise Fatal(f"{self.tag} failed syncing messages: {exc}") from None
                pending, self.pending = self.pending, []
                for message in reversed(pending):
                    message.finish()
            self.sync_due = False
        if self.close_due:
            self.close()
            self.close_due = False

    def _guard(self, step: Any, *args: Any) -> None:
        """Go exits the process on a write/sync/open failure; so do we, FINishing nothing."""
        try:
            step(*args)
        except Fatal as exc:
            self.logger.fatal(str(exc))
            os._exit(1)

    # ------------------------------------------------------------------ the file

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        if self.gzip is not None:
            self.gzip.write(data)
        else:
            try:
                write_all(self.fd, data)
            except OSError as exc:
                raise Fatal(f"{self.tag} writing message to disk: {exc}") from None
        self.filesize += len(data)

    def sync(self) -> None:
        assert self.fd is not None
        if self.gzip is not None:
            # close this member and start another (concatenated gzip): a member's trailer
            # checksums exactly the messages FINished by this sync
            write_all(self.fd, self.gzip.finish())
            os.fsync(self.fd)
            self.gzip = GzipMember(self.opts.gzip_level)
        else:
            os.fsync(self.fd)

    def current_filename(self) -> str:
        stamp = self.datetime.render()  # the same str object within a second
        if stamp is not self._stamp:
            self._stamp = stamp
            self._current = self.filename_format.replace("<DATETIME>", stamp)
        return self._current

    def needs_rotation(self) -> bool:
        if self.fd is None:
            return True
        filename = self.current_filename()
        if filename != self.filename:
            self.logger.info(f"{self.tag} new filename {filename}, rotating...")
            return True
        if self.opts.rotate_interval > 0:
            age = time.monotonic() - self.open_time
            if age > self.opts.rotate_interval:
                self.logger.info(f"{self.tag} {format_duration(age)} since last open, rotating...")
                return True
        if self.opts.rotate_size > 0 and self.filesize > self.opts.rotate_size:
            self.logger.info(
                f"{self.tag} {self.path} currently {self.filesize} bytes "
                f"(> {self.opts.rotate_size}), rotating..."
            )
            return True
        return False

    def close(self) -> None:
        """Finish the file (last gzip member, fsync) and move it from the work dir to the
        output dir without replacing anything there."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            if self.gzip is not None:
                write_all(fd, self.gzip.finish())
                self.gzip = None
            os.fsync(fd)
        except OSError as exc:
            raise Fatal(f"{self.tag} failed to fsync output file: {exc}") from None
        finally:
            os.close(fd)
        if self.opts.work_dir != self.opts.output_dir:
            self._move_to_output(self.path)

    def _move_to_output(self, src: str) -> None:
        opts = self.opts
        dst = go_path_join(opts.output_dir, src.removeprefix(opts.work_dir))
        self.logger.info(f"{self.tag} moving finished file {src} to {dst}")
        try:
            exclusive_rename(src, dst)
            return
        except FileExistsError:
            pass
        except OSError as exc:
            raise Fatal(f"{self.tag} unable to move file from {src} to {dst}: {exc}") from None
        # taken meanwhile: bump the revision until a free name turns up
        template = go_path_join(posixpath.dirname(dst), posixpath.basename(self.filename))
        rev = self.rev + 1
        while True:
            self.logger.warn(f"{self.tag} destination file already exists: {dst}")
            dst = rev_name(template, rev)
            try:
                exclusive_rename(src, dst)
            except FileExistsError:
                rev += 1
                continue
            except OSError as exc:
                raise Fatal(
                    f"{self.tag} unable to rename file from {src} to {dst}: {exc}"
                ) from None
            self.logger.info(f"{self.tag} renamed finished file {src} to {dst} to avoid overwrite")
            return

    def update_file(self) -> None:
        """Close the current file and open the next one, bumping ``<REV>`` past every name
        taken in the work dir or the output dir (Go: updateFile)."""
        self.close()
        filename = self.current_filename()
        self.rev = 0 if filename != self.filename else self.rev + 1
        self.filename = filename
        self.open_time = time.monotonic()
        opts = self.opts
        full_path = go_path_join(opts.work_dir, filename)
        self._make_dirs(full_path)
        exclusive = opts.gzip or opts.rotate_interval > 0
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
        while True:
            path = rev_name(full_path, self.rev)
            if opts.work_dir != opts.output_dir:
                output_path = go_path_join(opts.output_dir, path.removeprefix(opts.work_dir))
                self._make_dirs(output_path)
                if os.path.lexists(output_path):
                    self.logger.warn(f"{self.tag} output file already exists: {output_path}")
                    self.rev += 1
                    continue
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.logger.warn(f"{self.tag} working file already exists: {path}")
                self.rev += 1
                continue
            except OSError as exc:
                raise Fatal(f"{self.tag} unable to open {path}: {exc}") from None
            self.logger.info(f"{self.tag} opening {path}")
            self.filesize = os.fstat(fd).st_size
            if opts.rotate_size > 0 and self.filesize > opts.rotate_size:
                self.logger.info(
                    f"{self.tag} {path} currently {self.filesize} bytes "
                    f"(> {opts.rotate_size}), rotating..."
                )
                os.close(fd)
                self.rev += 1
                continue
            break
        self.fd, self.path = fd, path
        if opts.gzip:
            self.gzip = GzipMember(opts.gzip_level)
        elif self.filesize and not _ends_with_newline(path):
            self.write(b"\n")  # a torn last record (a killed run) stays on its own line

    def _make_dirs(self, path: str) -> None:
        directory = posixpath.dirname(path)
        if directory:
            try:
                os.makedirs(directory, 0o770, exist_ok=True)
            except OSError as exc:
                raise Fatal(f"{self.tag} unable to create dir: {exc}") from None


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as existing:
        existing.seek(-1, os.SEEK_END)
        return existing.read(1) == b"\n"
