"""Video clip preparation: decode with PyAV, sample frames at fixed times, orient, resize, encode each as JPEG.

`prepare_video` is the one entry point. Like `images.prepare_image` it raises `images.Rejected`
with a reason category for anything that cannot become a clip record. PyAV (`av`) is imported
only when a clip is prepared, so image-only builds never need it.
"""
from __future__ import annotations

import io
import math
import os
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Union

from PIL import Image

from shard_utils.extras import require
from shard_utils.inputs import VIDEO_EXTENSIONS  # noqa: F401 - the video step's extensions, named here too
from shard_utils.media.images import ImageOptions, Rejected, resize

__all__ = [
    "VIDEO_EXTENSIONS", "MAX_FRAMES", "Source", "VideoOptions", "PreparedVideo", "prepare_video", "container_format"
]

MAX_FRAMES = 10_000  # per clip: more is a typo, not a dataset
# The containers we read, told from their first bytes (never from the name, never by FFmpeg's own probing,
# which would also accept playlists and other formats that open further files or URLs).
_MP4_BOXES = {b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid"}
_MATROSKA_MAGIC = b"\x1a\x45\xdf\xa3"

Source = Union[bytes, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class VideoOptions:
    """How clips become frames: `frames` per clip (the dataset's static shape), optionally at `fps`.

    Without `fps`, the `frames` are spread evenly over the whole clip. With `fps`, they are the first
    `frames` frames of the clip resampled at `fps` (a window of frames/fps seconds from its start).
    `image` gives the size, resize mode, JPEG quality and pixel limit, exactly as for still images.
    """

    frames: int | None = None
    fps: float | None = None
    image: ImageOptions = field(default_factory=ImageOptions)

    def __post_init__(self) -> None:
        if self.frames is None:
            raise ValueError("video clips need a fixed number of frames per clip (--video-frames N), "
                             "so every record has the same shape")
        if isinstance(self.frames, bool) or not isinstance(self.frames, int) or not 1 <= self.frames <= MAX_FRAMES:
            raise ValueError(f"--video-frames must be an integer from 1 to {MAX_FRAMES}, got {self.frames!r}")
        if self.fps is not None and not (isinstance(self.fps, (int, float)) and math.isfinite(self.fps)
                                         and self.fps > 0):
            raise ValueError(f"--video-fps must be a positive number, got {self.fps!r}")


@dataclass(frozen=True)
class PreparedVideo:
    """A clip's sampled frames (JPEG each, all the same size) and the rate they were sampled at."""

    frames: tuple[bytes, ...]
    height: int
    width: int
    frame_rate: float  # frames per second of the stored frames: --video-fps, or frames / clip duration
    num_frames: int


@dataclass(frozen=True)
class _Timeline:
    """What the container's packets say about the video stream: first and end time (s), packet count."""

    start: Fraction
    end: Fraction
    count: int


def prepare_video(source: Source, options: VideoOptions) -> PreparedVideo:
    """Decode a clip (bytes or a local path) and return its sampled frames as JPEGs; raises Rejected."""
    av = require("av", "video", "reading video clips")
    _capture_errors(av)
    if _is_empty(source):
        raise Rejected("empty", "file is empty (0 bytes)")
    fmt = container_format(_head(source))
    if fmt is None:
        raise Rejected("not_video", "not an MP4/MOV, WebM/MKV or AVI container (judged from its first bytes)")
    with av.logging.Capture(local=True) as logs:
        try:
            timeline = _scan(av, source, fmt, options)
            _check_errors(logs)
            targets = _targets(timeline, options)
            frames = _sample(av, source, fmt, timeline, targets, options)
            _check_errors(logs)
        except Rejected:
            raise
        except av.error.FFmpegError as exc:
            raise Rejected("corrupt", f"cannot decode the clip: {_ffmpeg_message(exc, logs)}") from None
    sizes = {Image.open(io.BytesIO(f)).size for f in frames}
    if len(sizes) > 1:
        seen = ", ".join(f"{w}x{h}" for w, h in sorted(sizes))
        raise Rejected("mixed_sizes", f"the clip changes resolution ({seen}); "
                                      "pass --image-size with --resize fill or stretch to give every frame one size")
    width, height = sizes.pop()
    duration = timeline.end - timeline.start
    rate = float(options.fps) if options.fps else float(len(frames) / duration) if duration > 0 else 0.0
    return PreparedVideo(tuple(frames), height, width, rate, len(frames))


def container_format(head: bytes) -> str | None:
    """The FFmpeg demuxer for a file's first bytes: 'mov' (MP4/MOV), 'matroska' (MKV/WebM), 'avi', or None."""
    if head[4:8] in _MP4_BOXES:
        return "mov"
    if head.startswith(_MATROSKA_MAGIC):
        return "matroska"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    return None


def _capture_errors(av) -> None:
    """Let FFmpeg's error messages reach PyAV's log capture (PyAV drops all of them by default).

    Repeats are not skipped: PyAV would otherwise drop a message identical to one another thread just
    logged, and whether a clip is rejected would depend on what ran beside it.
    """
    if av.logging.get_level() is None or av.logging.get_level() < av.logging.ERROR:
        av.logging.set_level(av.logging.ERROR)
    av.logging.set_skip_repeated(False)


def _check_errors(logs: list) -> None:
    """Any error FFmpeg logged while demuxing or decoding (a truncated or damaged stream) rejects the clip."""
    errors = [(name, message.strip()) for level, name, message in logs if level <= 16]  # AV_LOG_ERROR
    if errors:
        name, message = errors[0]
        raise Rejected("corrupt", f"damaged video data ({name}: {message})")


def _ffmpeg_message(exc: Exception, logs: list) -> str:
    """PyAV's one-line error, with FFmpeg's own logged reason when PyAV did not already add it."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    detail = next((m.strip() for level, _, m in logs if level <= 16), "")
    return f"{text} ({detail})" if detail and detail not in text else text


def _is_empty(source: Source) -> bool:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return len(source) == 0
    return os.path.getsize(source) == 0


def _head(source: Source) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source[:16])
    with open(source, "rb") as f:
        return f.read(16)


def _open(av, source: Source, fmt: str):
    """Open the container with the demuxer chosen from its bytes; local files go through a Python file
    object, so FFmpeg never interprets the name (no protocols, no other files)."""
    stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else open(source, "rb")
    try:
        container = av.open(stream, mode="r", format=fmt)
    except av.error.FFmpegError as exc:
        stream.close()
        raise Rejected("not_video", f"FFmpeg cannot read the {fmt} container (truncated, or not a video): "
                                    f"{_ffmpeg_message(exc, [])}") from None
    return container, stream


def _video_stream(container):
    """The first video stream that is not an attached picture (cover art); rejects when there is none."""
    for stream in container.streams.video:
        if not stream.disposition & 1024:  # AV_DISPOSITION_ATTACHED_PIC
            return stream
    kinds = sorted({s.type for s in container.streams}) or ["nothing"]
    raise Rejected("no_video_stream", f"the file has no video stream (it holds {', '.join(kinds)})")


def _scan(av, source: Source, fmt: str, options: VideoOptions) -> _Timeline:
    """Read every packet of the video stream once, without decoding: count, first and end time."""
    container, stream_file = _open(av, source, fmt)
    with container, stream_file:
        stream = _video_stream(container)
        _check_pixels(stream.codec_context.width, stream.codec_context.height, options.image.max_pixels)
        base = stream.time_base
        count, first, last, last_duration = 0, None, None, 0
        for packet in container.demux(stream):
            if packet.size == 0:
                continue  # the demuxer's end-of-stream marker
            ts = packet.pts if packet.pts is not None else packet.dts
            if ts is None:
                raise Rejected("corrupt", "a video packet has no timestamp")
            count += 1
            first = ts if first is None else min(first, ts)
            if last is None or ts >= last:
                last, last_duration = ts, packet.duration or 0
        if count == 0:
            raise Rejected("too_few_frames", "the clip has no video frames")
        step = Fraction(last_duration) if last_duration else _typical_step(first, last, count, stream, base)
        return _Timeline(Fraction(first) * base, (Fraction(last) + step) * base, count)


def _typical_step(first: int, last: int, count: int, stream, base: Fraction) -> Fraction:
    """A frame's duration in stream ticks when the packets do not say: the mean gap, or 1 / average rate."""
    if count > 1 and last > first:
        return Fraction(last - first, count - 1)
    rate = stream.average_rate or stream.guessed_rate
    return Fraction(1) / (Fraction(rate) * base) if rate else Fraction(0)


def _targets(timeline: _Timeline, options: VideoOptions) -> list[Fraction]:
    """The times (s) at which frames are taken: the middle of N equal parts of the clip, or start + i / fps."""
    n = options.frames
    duration = timeline.end - timeline.start
    if options.fps is None:
        if timeline.count < n:
            raise Rejected("too_few_frames", f"the clip has {timeline.count} frames; --video-frames asks for {n}")
        return [timeline.start + (2 * i + 1) * duration / (2 * n) for i in range(n)]
    step = Fraction(options.fps).limit_denominator(1_000_000) ** -1
    if (n - 1) * step >= duration:
        raise Rejected("too_few_frames", f"the clip lasts {float(duration):.3f} s; {n} frames at {options.fps:g} fps "
                                         f"need a clip longer than {float((n - 1) * step):.3f} s")
    return [timeline.start + i * step for i in range(n)]


def _sample(av, source: Source, fmt: str, timeline: _Timeline, targets: list[Fraction],
            options: VideoOptions) -> list[bytes]:
    """Decode in order, from the start (no seeking: exact and the same every time), and encode the frame on
    screen at each target time. Only the current frame is held; decoding stops after the last target."""
    container, stream_file = _open(av, source, fmt)
    out: list[bytes] = []
    with container, stream_file:
        stream = _video_stream(container)
        stream.codec_context.thread_count = 1  # decode on this thread: its errors reach this thread's log capture
        base = stream.time_base
        held = held_time = held_jpeg = None
        for frame in container.decode(stream):
            time = _frame_time(frame, base, held_time)
            if held is not None:  # `held` was on screen from held_time until now (the first one from the start)
                while len(out) < len(targets) and targets[len(out)] < time:
                    held_jpeg = held_jpeg or _encode(held, options)
                    out.append(held_jpeg)
                if len(out) == len(targets):
                    return out
            held, held_time, held_jpeg = frame, time, None
        if held is not None:
            step = (timeline.end - timeline.start) / timeline.count
            end = held_time + (Fraction(held.duration) * base if held.duration else step)
            while len(out) < len(targets) and targets[len(out)] < end:
                held_jpeg = held_jpeg or _encode(held, options)
                out.append(held_jpeg)
    if len(out) < len(targets):
        raise Rejected("corrupt", f"only {len(out)} of {len(targets)} frames could be decoded; "
                                  "the stream ends before its packets say")
    return out


def _frame_time(frame, base: Fraction, previous: Fraction | None) -> Fraction:
    if frame.is_corrupt:
        at = float(frame.pts or 0) * float(base)
        raise Rejected("corrupt", f"the decoder marked the frame at {at:.3f} s corrupt")
    if frame.pts is None:
        raise Rejected("corrupt", "a decoded frame has no timestamp")
    time = Fraction(frame.pts) * base
    if previous is not None and time <= previous:
        raise Rejected("corrupt", f"frame timestamps go backwards at {float(time):.3f} s")
    return time


def _encode(frame, options: VideoOptions) -> bytes:
    """One decoded frame as JPEG: RGB, turned upright as the display matrix says, resized like images."""
    _check_pixels(frame.width, frame.height, options.image.max_pixels)
    image = frame.to_image()  # RGB, converted from the stream's YUV by swscale
    transform = _display_transform(frame)
    for step in transform:
        image = image.transpose(step)
    if options.image.size is not None:
        image = resize(image, options.image.size, options.image.resize)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=options.image.quality)
    return out.getvalue()


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise Rejected("too_large", f"{width}x{height} = {width * height} pixels per frame exceeds --max-pixels "
                                    f"{max_pixels}")


def _display_transform(frame) -> list[Image.Transpose]:
    """The transposes that show a frame upright, following its display matrix as FFmpeg's autorotate does
    (right angles, with or without a mirror); other angles are left as stored."""
    matrix = _display_matrix(frame)
    if matrix is None:
        return []
    theta = (-frame.rotation) % 360  # degrees clockwise, as ffmpeg's get_rotation
    if theta == 90:
        return [Image.Transpose.TRANSPOSE if matrix[3] > 0 else Image.Transpose.ROTATE_270]
    if theta == 180:
        return [t for t, flip in ((Image.Transpose.FLIP_LEFT_RIGHT, matrix[0] < 0),
                                  (Image.Transpose.FLIP_TOP_BOTTOM, matrix[4] < 0)) if flip]
    if theta == 270:
        return [Image.Transpose.TRANSVERSE if matrix[3] < 0 else Image.Transpose.ROTATE_90]
    if theta == 0 and matrix[4] < 0:
        return [Image.Transpose.FLIP_TOP_BOTTOM]
    return []


def _display_matrix(frame) -> tuple[int, ...] | None:
    for data in frame.side_data:
        if data.type.name == "DISPLAYMATRIX" and len(bytes(data)) == 36:
            return struct.unpack("=9i", bytes(data))
    return None
