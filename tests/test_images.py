"""Decoding, orientation, colour conversion, resizing and pass-through, on real image bytes."""
import io
import struct
import zlib

import numpy as np
import pytest
from conftest import photo, run_job
from readers import by_source, decoded, rejected

from shard_utils.format import schema
from shard_utils.media.images import ImageOptions, Rejected, prepare_image


def encode(image, fmt, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def pixels(data: bytes) -> np.ndarray:
    from PIL import Image

    image = Image.open(io.BytesIO(data))
    assert image.format == "JPEG"
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def solid(mode, size, color):
    from PIL import Image

    return Image.new(mode, size, color)


def close(a: np.ndarray, rgb, tol=6) -> bool:
    return bool(np.abs(a.reshape(-1, 3).mean(0) - np.array(rgb)).max() <= tol)


def test_rgb_jpeg_passes_through_byte_identical():
    data = encode(photo(40, 30, 1), "JPEG", quality=80)
    out = prepare_image(data, ImageOptions())
    assert out.passed_through and out.encoded == data and (out.width, out.height, out.channels) == (40, 30, 3)


def test_grayscale_jpeg_passes_through_with_one_channel():
    data = encode(photo(20, 10, 2).convert("L"), "JPEG")
    out = prepare_image(data, ImageOptions())
    assert out.passed_through and out.encoded == data and out.channels == 1


def test_resize_request_disables_pass_through():
    data = encode(photo(40, 30, 1), "JPEG")
    out = prepare_image(data, ImageOptions(size=(16, 16)))
    assert not out.passed_through and (out.height, out.width) == (16, 16)


def exif_jpeg(image, orientation: int) -> bytes:
    exif = image.getexif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif.tobytes())


def test_exif_orientation_is_applied():
    from PIL import Image

    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    out = prepare_image(exif_jpeg(image, 6), ImageOptions())  # 6: rotate 90 degrees clockwise to display
    assert not out.passed_through and (out.width, out.height) == (20, 40)
    px = pixels(out.encoded)
    assert close(px[:15], (255, 0, 0), 20) and close(px[25:], (0, 0, 255), 20)  # red ends on top


def test_an_xmp_orientation_without_exif_is_applied():
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    out = prepare_image(encode(photo(40, 20, 4), "JPEG", quality=95, xmp=xmp), ImageOptions())
    assert not out.passed_through and (out.width, out.height) == (20, 40)


def test_absurd_exif_orientation_is_ignored():
    data = exif_jpeg(photo(30, 20, 3), 9999 % 65536)
    out = prepare_image(data, ImageOptions())
    assert out.passed_through and (out.width, out.height) == (30, 20)


def test_sixteen_bit_grayscale_is_scaled_not_clipped():
    from PIL import Image

    values = np.array([[0, 16384, 32768, 65535]], dtype=np.uint16).repeat(8, 0).repeat(8, 1)
    data = encode(Image.fromarray(values), "PNG")
    px = pixels(prepare_image(data, ImageOptions(quality=100)).encoded)
    columns = px[:, :, 0].reshape(8, 4, 8).mean(axis=(0, 2))
    assert np.allclose(columns, [0, 64, 128, 255], atol=4), columns


@pytest.mark.parametrize("mode,color,expected", [
    ("CMYK", (0, 255, 255, 0), (255, 0, 0)),
    ("L", 128, (128, 128, 128)),
    ("1", 1, (255, 255, 255)),
])
def test_colour_modes_become_rgb(mode, color, expected):
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    out = prepare_image(encode(solid(mode, (16, 16), color), fmt), ImageOptions(quality=100))
    assert out.channels == 3 and close(pixels(out.encoded), expected, 8)


def test_alpha_is_composited_on_the_background():
    image = solid("RGBA", (16, 16), (255, 0, 0, 0))
    image.paste((0, 0, 255, 255), (0, 0, 8, 16))
    px = pixels(prepare_image(encode(image, "PNG"), ImageOptions(quality=100)).encoded)
    assert close(px[:, :6], (0, 0, 255), 10) and close(px[:, 10:], (255, 255, 255), 10)
    px = pixels(prepare_image(encode(image, "PNG"), ImageOptions(quality=100, background=(0, 0, 0))).encoded)
    assert close(px[:, 10:], (0, 0, 0), 10)


def test_palette_with_transparency_and_gif_first_frame():
    first = solid("RGB", (16, 16), (0, 200, 0)).convert("P")
    second = solid("RGB", (16, 16), (200, 0, 0)).convert("P")
    gif = io.BytesIO()
    first.save(gif, "GIF", save_all=True, append_images=[second])
    assert close(pixels(prepare_image(gif.getvalue(), ImageOptions(quality=100)).encoded), (0, 200, 0), 10)
    pal = solid("P", (8, 8), 1)
    pal.putpalette([0, 0, 0, 10, 20, 250] + [0] * 762)
    pal.info["transparency"] = 0
    assert close(pixels(prepare_image(encode(pal, "PNG", transparency=0), ImageOptions(quality=100)).encoded),
                 (10, 20, 250), 10)


@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "BMP", "TIFF", "GIF"])
def test_other_formats_reencode_to_jpeg(fmt):
    out = prepare_image(encode(solid("RGB", (24, 12), (40, 90, 200)), fmt), ImageOptions(quality=100))
    assert not out.passed_through and (out.width, out.height) == (24, 12)
    assert close(pixels(out.encoded), (40, 90, 200), 12)


@pytest.mark.parametrize("mode,size", [("fill", (20, 30)), ("stretch", (20, 30)), ("fit", (20, 20))])
def test_resize_modes(mode, size):
    out = prepare_image(encode(photo(60, 60, 5), "PNG"), ImageOptions(size=(20, 30), resize=mode))
    assert (out.height, out.width) == size


def test_fill_resize_of_a_rotated_jpeg_uses_displayed_orientation():
    out = prepare_image(exif_jpeg(photo(400, 200, 6), 8), ImageOptions(size=(50, 20), resize="fill"))
    assert (out.height, out.width) == (50, 20)


def exif_after_pixels(png: bytes, orientation: int) -> bytes:
    """The PNG with an eXIf chunk holding `orientation` just before IEND (after its pixels, as older writers put it)."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    body = exif.tobytes()[6:]  # without the "Exif\0\0" header a JPEG's APP1 has
    chunk = struct.pack(">I", len(body)) + b"eXIf" + body + struct.pack(">I", zlib.crc32(b"eXIf" + body))
    return png[:-12] + chunk + png[-12:]


def test_a_png_orientation_is_applied_before_or_after_its_pixels_and_resized_as_displayed():
    from PIL import Image

    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    for data in (encode(image, "PNG", exif=exif.tobytes()), exif_after_pixels(encode(image, "PNG"), 6)):
        out = prepare_image(data, ImageOptions())
        assert (out.width, out.height) == (20, 40)
        px = pixels(out.encoded)
        assert close(px[:15], (255, 0, 0), 20) and close(px[25:], (0, 0, 255), 20)  # red ends on top
        assert (prepare_image(data, ImageOptions(size=(30, 10), resize="fill")).height, out.width) == (30, 20)


@pytest.mark.parametrize("chunk", ["xmp", "raw profile"])
def test_a_png_orientation_in_a_text_chunk_is_applied(chunk):
    from PIL import Image, PngImagePlugin

    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    info = PngImagePlugin.PngInfo()
    if chunk == "xmp":
        info.add_itxt("XML:com.adobe.xmp", '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description '
                                           'tiff:Orientation="6"/></x:xmpmeta>')
    else:  # ImageMagick's form: a blank line, the profile's name, its length, then its bytes in hex
        exif = Image.Exif()
        exif[0x0112] = 6
        body = exif.tobytes()
        info.add_text("Raw profile type exif", f"\nexif\n{len(body):8d}\n{body.hex()}", zip=True)
    out = prepare_image(encode(image, "PNG", pnginfo=info), ImageOptions())
    assert (out.width, out.height) == (20, 40)
    px = pixels(out.encoded)
    assert close(px[:15], (255, 0, 0), 20) and close(px[25:], (0, 0, 255), 20)  # red ends on top


def test_a_png_over_the_memory_budget_is_refused_before_its_pixels_are_decoded(monkeypatch):
    from PIL import Image, PngImagePlugin

    decoded_pngs = []
    load = PngImagePlugin.PngImageFile.load
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", lambda self: decoded_pngs.append(self) or load(self))
    data = encode(Image.new("L", (1500, 1500)), "PNG")
    with pytest.raises(Rejected) as found:
        prepare_image(data, ImageOptions(memory=1 << 20))
    assert found.value.reason == "too_large" and decoded_pngs == []
    assert prepare_image(data, ImageOptions()).width == 1500 and decoded_pngs  # the spy sees a decode


def png_header_only(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize("data,reason", [
    (b"", "empty"),
    (b"<html><body>not an image</body></html>", "not_image"),
    (png_header_only(60000, 60000), "too_large"),
    (png_header_only(3000, 3000), "too_large"),  # over the small --max-pixels below
])
def test_bad_inputs_are_rejected_with_a_reason(data, reason):
    with pytest.raises(Rejected) as info:
        prepare_image(data, ImageOptions(max_pixels=4_000_000))
    assert info.value.reason == reason and info.value.message


@pytest.mark.parametrize("validate", ["decode", "structure"])
def test_truncated_jpeg_is_rejected_even_on_the_pass_through_path(validate):
    data = encode(photo(64, 64, 9), "JPEG")
    assert prepare_image(data, ImageOptions(validate=validate)).passed_through
    for cut in (len(data) // 2, len(data) - 1):
        with pytest.raises(Rejected) as info:
            prepare_image(data[:cut], ImageOptions(validate=validate))
        assert info.value.reason == "corrupt"


@pytest.mark.slow
def test_job_handles_every_format_and_records_decoded_pixels(tmp_path):
    src = tmp_path / "in" / "things"
    src.mkdir(parents=True)
    color = (40, 90, 200)
    for name, fmt, mode in [("a.PNG", "PNG", "RGB"), ("b.Gif", "GIF", "RGB"), ("c.webp", "WEBP", "RGB"),
                            ("d.bmp", "BMP", "RGB"), ("e.TIFF", "TIFF", "RGB"), ("f.jpeg", "JPEG", "CMYK"),
                            ("g.JPG", "JPEG", "RGB"), ("h.png", "PNG", "RGBA")]:
        c = tuple(255 - v for v in color) + (0,) if mode == "CMYK" else color + ((255,) if mode == "RGBA" else ())
        (src / name).write_bytes(encode(solid(mode, (16, 8), c), fmt, **({"quality": 100} if fmt == "JPEG" else {})))
    (src / "z.jpg").write_bytes(b"")
    out = tmp_path / "out"
    m = run_job(tmp_path / "in", out, "--num-cores", "1", "--jpeg-quality", "100")
    recs = by_source(out)
    assert len(recs) == 8 and rejected(out) == {"things/z.jpg": "empty"}
    for source, rec in recs.items():
        image = decoded(rec)
        assert image.size == (16, 8), source
        assert close(np.asarray(image.convert("RGB"), dtype=np.int16), color, 14), source
    assert recs["things/g.JPG"][schema.IMAGE_ENCODED] == (src / "g.JPG").read_bytes()
    assert m.files_seen == 9


@pytest.mark.parametrize("options", [ImageOptions(), ImageOptions(validate="structure"), ImageOptions(size=(16, 16))],
                         ids=["pass-through", "structure", "re-encoded"])
def test_a_jpeg_with_more_than_100_scans_is_rejected_too_complex_before_decoding(options):
    """A progressive JPEG costs a pass over the picture per scan; the scans are counted in the marker walk."""
    from hostile import scan_bomb_jpeg

    with pytest.raises(Rejected) as err:
        prepare_image(scan_bomb_jpeg(150), options)
    assert err.value.reason == "too_complex" and "more than 100 scans" in err.value.message
    fine = prepare_image(scan_bomb_jpeg(80), options)  # 90 scans: unusual, allowed
    assert fine.passed_through == (options.size is None)
