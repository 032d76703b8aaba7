"""Video clips through `shard_utils.media.video.prepare_video`, on small clips PyAV encodes here (no downloads)."""
from __future__ import annotations

import io
import subprocess
import sys
from fractions import Fraction

import av
import numpy as np
import pytest
from conftest import REPO
from PIL import Image, ImageOps

from shard_utils.media.images import ImageOptions, Rejected
from shard_utils.media.video import VIDEO_EXTENSIONS, VideoOptions, container_format, prepare_video

W, H = 64, 48
CODECS = [("mpeg4", "mp4"), ("libx264", "mp4"), ("libvpx", "webm"), ("libvpx-vp9", "webm"), ("mjpeg", "avi")]


def level_frame(i: int) -> np.ndarray:
    """Frame i: a flat gray of level 8*i, so the index can be read back after lossy coding."""
    return np.full((H, W, 3), 8 * i, np.uint8)


def gradient_frame(i: int = 0) -> np.ndarray:
    """An image that looks different under every rotation and mirror."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([x * 4, y * 5, 128 + 0 * x], -1).astype(np.uint8)


def make_clip(codec: str = "libx264", fmt: str = "mp4", n: int = 30, rate: int = 15, frame=level_frame,
              rotation: int | None = None, hflip: bool = False) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = W, H
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if rotation is not None or hflip:
            stream.set_display_rotation(rotation or 0, hflip=hflip)
        for i in range(n):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame(i), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def pixels(jpeg: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(jpeg)) as image:
        assert image.format == "JPEG"
        return np.asarray(image.convert("RGB"), np.float64)


def frame_index(jpeg: bytes) -> int:
    return int(round(pixels(jpeg).mean() / 8))


@pytest.fixture(scope="module")
def clips() -> dict[tuple[str, str], bytes]:
    return {(codec, fmt): make_clip(codec, fmt) for codec, fmt in CODECS}


@pytest.mark.parametrize("codec,fmt", CODECS)
def test_frames_are_spread_evenly_over_the_clip(clips, codec, fmt):
    clip = prepare_video(clips[codec, fmt], VideoOptions(frames=8))
    # 30 frames at 15 fps: the frames on screen at the middle of 8 equal parts of the 2 s clip
    assert [frame_index(f) for f in clip.frames] == [int((2 * i + 1) * 30 / 16) for i in range(8)]
    assert (clip.num_frames, clip.width, clip.height) == (8, W, H)
    assert clip.frame_rate == pytest.approx(4.0, rel=1e-3)
    assert all(pixels(f).shape == (H, W, 3) for f in clip.frames)


@pytest.mark.parametrize("codec,fmt", [("libx264", "mp4"), ("libvpx-vp9", "webm")])
def test_fps_takes_the_first_frames_at_that_rate(clips, codec, fmt):
    clip = prepare_video(clips[codec, fmt], VideoOptions(frames=16, fps=8))
    assert [frame_index(f) for f in clip.frames] == [i * 15 // 8 for i in range(16)]
    assert clip.frame_rate == 8.0
    # Faster than the clip: each frame is the one on screen at i/30 s. WebM stores whole milliseconds
    # (frame 1 starts at 0.067 s, after 2/30 s), MP4 exact fifteenths.
    starts = [Fraction(round(k * 1000 / 15), 1000) if fmt == "webm" else Fraction(k, 15) for k in range(30)]
    expected = [max(k for k in range(30) if starts[k] <= Fraction(i, 30)) for i in range(4)]
    assert expected == ([0, 0, 0, 1] if fmt == "webm" else [0, 0, 1, 1])
    faster = prepare_video(clips[codec, fmt], VideoOptions(frames=4, fps=30))
    assert [frame_index(f) for f in faster.frames] == expected
    assert faster.frames[0] == faster.frames[1]  # the same frame, encoded once


def test_same_clip_gives_the_same_bytes_from_bytes_and_from_a_path(clips, tmp_path):
    data = clips["libx264", "mp4"]
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    options = VideoOptions(frames=5, image=ImageOptions(size=(24, 24)))
    first = prepare_video(data, options)
    assert prepare_video(data, options) == first
    assert prepare_video(str(path), options) == first


def test_frames_are_resized_and_encoded_like_images(clips):
    data = clips["mpeg4", "mp4"]
    filled = prepare_video(data, VideoOptions(frames=3, image=ImageOptions(size=(32, 32), resize="fill")))
    fitted = prepare_video(data, VideoOptions(frames=3, image=ImageOptions(size=(32, 32), resize="fit")))
    assert (filled.height, filled.width) == (32, 32) and (fitted.height, fitted.width) == (24, 32)
    assert all(pixels(f).shape == (32, 32, 3) for f in filled.frames)
    detailed = make_clip("libx264", "mp4", n=6, frame=lambda i: np.roll(gradient_frame(), i, axis=1))
    low = prepare_video(detailed, VideoOptions(frames=3, image=ImageOptions(quality=20)))
    high = prepare_video(detailed, VideoOptions(frames=3, image=ImageOptions(quality=95)))
    assert sum(map(len, low.frames)) < sum(map(len, high.frames))


def _orientations(image: Image.Image) -> dict[str, Image.Image]:
    out = {}
    for degrees in (0, 90, 180, 270):
        turned = image.rotate(degrees, expand=True)
        out[f"rot{degrees}"] = turned
        out[f"rot{degrees}+mirror"] = ImageOps.mirror(turned)
    return out


@pytest.mark.parametrize("codec,fmt", [("libx264", "mp4"), ("libvpx", "webm")])
@pytest.mark.parametrize("degrees,hflip", [(0, False), (90, False), (-90, False), (180, False), (0, True),
                                           (90, True), (270, True)])
def test_display_matrix_turns_frames_upright(codec, fmt, degrees, hflip):
    """PyAV writes the matrix as 'rotate counter-clockwise by degrees, then mirror'; frames come out so."""
    data = make_clip(codec, fmt, n=3, frame=gradient_frame, rotation=degrees, hflip=hflip)
    got = pixels(prepare_video(data, VideoOptions(frames=1)).frames[0])
    candidates = _orientations(Image.fromarray(gradient_frame()))
    errors = {name: np.abs(np.asarray(img, np.float64) - got).mean() if img.size == (got.shape[1], got.shape[0])
              else np.inf for name, img in candidates.items()}
    expected = f"rot{degrees % 360}" + ("+mirror" if hflip else "")
    assert min(errors, key=errors.get) == expected, errors
    assert errors[expected] < 6


def audio_only_clip() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("aac", rate=16000)
        stream.layout = "mono"
        for i in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def zero_length_clip(fmt: str, codec: str) -> bytes:
    """A container with a header and a video stream but not one frame."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height = W, H
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        container.start_encoding()
    return buf.getvalue()


def mixed_size_clip() -> bytes:
    """MJPEG in AVI whose last frames are half the size of the first (each JPEG stands alone)."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="avi") as container:
        stream = container.add_stream("mjpeg", rate=10)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuvj420p"
        small = av.CodecContext.create("mjpeg", "w")
        small.width, small.height, small.pix_fmt, small.time_base = W // 2, H // 2, "yuvj420p", Fraction(1, 10)
        for i in range(6):
            big = i < 3
            frame = av.VideoFrame.from_ndarray(np.full((H, W, 3) if big else (H // 2, W // 2, 3), 100, np.uint8),
                                               format="rgb24").reformat(format="yuvj420p")
            frame.pts, frame.time_base = i, Fraction(1, 10)
            for packet in (stream.encode(frame) if big else small.encode(frame)):
                packet.stream, packet.pts, packet.dts, packet.time_base = stream, i, i, Fraction(1, 10)
                container.mux(packet)
    return buf.getvalue()


def flip_middle(data: bytes, length: int = 64) -> bytes:
    out = bytearray(data)
    for k in range(len(data) // 3, len(data) // 3 + length):
        out[k] ^= 0xFF
    return bytes(out)


def test_bad_clips_are_rejected_with_a_reason(clips):
    h264, vp8, mjpeg = clips["libx264", "mp4"], clips["libvpx", "webm"], clips["mjpeg", "avi"]
    eight = VideoOptions(frames=8)
    cases = {
        "empty file": (b"", eight, "empty"),
        "text named .mp4": (b"<html>not a video</html>" * 10, eight, "not_video"),
        "HLS playlist named .mp4": (b"#EXTM3U\n#EXTINF:1,\nhttp://127.0.0.1:9/x.ts\n", eight, "not_video"),
        "audio only": (audio_only_clip(), eight, "no_video_stream"),
        "zero-length mp4": (zero_length_clip("mp4", "libx264"), eight, "no_video_stream"),
        "zero-length avi": (zero_length_clip("avi", "mjpeg"), eight, "too_few_frames"),
        "30 frames, 31 asked": (h264, VideoOptions(frames=31), "too_few_frames"),
        "2 s clip, 16 frames at 7.5 fps": (h264, VideoOptions(frames=16, fps=7.5), "too_few_frames"),
        "mp4 cut in half": (h264[: len(h264) // 2], eight, "not_video"),
        "h264 bytes flipped in the middle": (flip_middle(h264), eight, "corrupt"),
        "webm cut in half": (vp8[: len(vp8) // 2], eight, "corrupt"),
        "webm bytes flipped in the middle": (flip_middle(vp8), eight, "corrupt"),
        "avi cut in half": (mjpeg[: len(mjpeg) // 2], eight, "corrupt"),
        "frames over --max-pixels": (h264, VideoOptions(frames=2, image=ImageOptions(max_pixels=W * H - 1)),
                                     "too_large"),
        "resolution changes": (mixed_size_clip(), VideoOptions(frames=4), "mixed_sizes"),
    }
    got = {}
    for name, (data, options, _) in cases.items():
        with pytest.raises(Rejected) as info:
            prepare_video(data, options)
        assert info.value.message and "\n" not in info.value.message, name
        got[name] = info.value.reason
    assert got == {name: reason for name, (_, _, reason) in cases.items()}


def test_a_fixed_size_makes_a_clip_that_changes_resolution_usable():
    clip = prepare_video(mixed_size_clip(), VideoOptions(frames=4, image=ImageOptions(size=(20, 20))))
    assert (clip.num_frames, clip.height, clip.width) == (4, 20, 20)


def test_container_is_judged_from_its_first_bytes(clips):
    assert {fmt: container_format(clips[codec, fmt][:16]) for codec, fmt in CODECS} == {
        "mp4": "mov", "webm": "matroska", "avi": "avi"}
    assert container_format(b"\xff\xd8\xff\xe0" + bytes(12)) is None  # a JPEG
    assert VIDEO_EXTENSIONS == {".mp4", ".mov", ".webm", ".mkv", ".avi"}


@pytest.mark.parametrize("kwargs,needle", [
    ({}, "--video-frames"), ({"frames": 0}, "--video-frames"), ({"frames": 2.5}, "--video-frames"),
    ({"frames": 4, "fps": 0}, "--video-fps"), ({"frames": 4, "fps": float("nan")}, "--video-fps"),
])
def test_bad_options_say_which_flag(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        VideoOptions(**kwargs)


def test_without_pyav_the_error_names_the_extra(clips, tmp_path):
    path = tmp_path / "clip.mp4"
    path.write_bytes(clips["libx264", "mp4"])
    code = (
        "import sys; sys.modules['av'] = None\n"  # what an environment without PyAV looks like to `import av`
        "from shard_utils.media.video import VideoOptions, prepare_video\n"
        "from shard_utils.extras import MissingExtra\n"
        "try:\n"
        f"    prepare_video({str(path)!r}, VideoOptions(frames=2))\n"
        "except MissingExtra as exc:\n"
        "    print(exc); sys.exit(7)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 7, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and 'pip install -e ".[video]"' in lines[0] and "needs av" in lines[0]
