"""Memory is a budget, never a rejection: deep images convert in integers, an image over a worker's budget is
rejected `too_large` with its figure, and a worker the system kills or starves is retried alone, then stops the
build naming the file. Memory limits are real: an address-space limit (RLIMIT_AS) on the process that decodes."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, faults, run_cli, write_images
from hostile import deep_png, png_header
from PIL import Image
from readers import rejected

from shard_utils.media import budget
from shard_utils.media.images import ImageOptions, Rejected, prepare_image, to_rgb

MIB = 1 << 20


@pytest.mark.parametrize("mode,values", [
    ("I;16", [0, 1, 128, 129, 385, 386, 32767, 65278, 65535]),
    ("I", [-70000, -1, 0, 128, 129, 65535, 65536, 2**31 - 1]),
    ("F", [-3.5, 0.49, 0.5, 1.5, 2.5, 254.5, 255.4, 300.0]),
])
def test_deep_modes_scale_in_integers_exactly_as_the_float_formula(mode, values):
    dtype = {"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode]
    image = Image.fromarray(np.array([values], dtype=dtype), mode if mode != "I;16" else None)
    assert image.mode == mode
    floats = np.array(values, dtype=np.float64)
    expected = np.clip(np.rint(floats if mode == "F" else floats / 257.0), 0, 255).astype(np.uint8)
    assert np.asarray(to_rgb(image))[0, :, 0].tolist() == expected.tolist()


def test_an_image_over_the_budget_is_rejected_too_large_with_its_figure():
    data = png_header(6000, 6000)  # 8-bit grayscale: 36 million pixels
    with pytest.raises(Rejected) as found:
        prepare_image(data, ImageOptions(memory=256 * MIB))
    need = budget.decode_bytes("L", 6000, 6000, None)
    assert found.value.reason == "too_large"
    assert f"6000x6000 L image needs about {budget.mib(need)}" in found.value.message
    assert "256 MiB a worker may use" in found.value.message


def test_max_pixels_above_pillows_own_limit_is_what_decides(monkeypatch):
    """Pillow refuses over 2 x MAX_IMAGE_PIXELS (178,956,970) whatever --max-pixels says; above it, --max-pixels
    and the budget decide: this 182-megapixel header is opened, and refused only for its missing pixels."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    data = png_header(14_000, 13_000)
    with pytest.raises(Rejected) as found:
        prepare_image(data, ImageOptions(size=(64, 64), max_pixels=200_000_000, memory=2048 * MIB))
    assert found.value.reason == "corrupt", found.value.message
    with pytest.raises(Rejected) as found:
        prepare_image(data, ImageOptions(size=(64, 64), max_pixels=150_000_000, memory=2048 * MIB))
    assert "exceeds --max-pixels 150000000" in found.value.message


def test_the_budget_covers_what_decoding_takes():
    """The figures per pixel are at least the peaks measured with `ru_maxrss` for 4000x4000 images of each mode
    (docs/images.md), at full size and resized."""
    measured_mib = {"I;16": 108, "I": 148, "F": 148, "L": 81, "P": 81, "RGB": 83, "RGBA": 184, "LA": 245}
    for mode, peak in measured_mib.items():
        assert budget.decode_bytes(mode, 4000, 4000, 224 * 224) > peak * MIB, mode
        assert budget.decode_bytes(mode, 4000, 4000, None) > peak * MIB, mode


def _decode_under_limit(path: Path, limit: int) -> dict:
    """encode_data of the image at `path`, resized to 64x64, in a process whose address space is `limit` bytes."""
    code = ("import json, sys\n"
            "from shard_utils.inputs import MediaItem\n"
            "from shard_utils.media.encode import EncodeSettings, encode_data\n"
            "from shard_utils.media.images import ImageOptions\n"
            "item = MediaItem('deep.png', sys.argv[1], 0, ('a',))\n"
            "settings = EncodeSettings(image=ImageOptions(size=(64, 64)), label_ids={'a': 0})\n"
            "try:\n"
            "    out = encode_data(item, settings, open(sys.argv[1], 'rb').read())\n"
            "    print(json.dumps(out if isinstance(out, dict) else {'record': out.meta.height}))\n"
            "except Exception as exc:\n"
            "    print(json.dumps({'raised': type(exc).__name__, 'message': str(exc)}))\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_a_deep_10000_square_png_decodes_in_1200_mib_and_a_refused_allocation_is_never_a_rejection(tmp_path):
    """The float64 conversion needed 2.6 GB for this 200 KB file; in its own bit depth it takes about 700 MB.
    Under a limit too small even for that, the system's refusal stops the build naming the file (OutOfMemory),
    where it used to be rejected `corrupt`."""
    path = deep_png(tmp_path / "deep.png")
    assert _decode_under_limit(path, 1200 * MIB) == {"record": 64}
    starved = _decode_under_limit(path, 500 * MIB)
    assert starved["raised"] == "OutOfMemory", starved
    assert starved["message"].startswith("deep.png: ")


@pytest.mark.slow
def test_identical_deep_pngs_all_become_records_under_a_worker_memory_limit(tmp_path):
    """Three copies of the 10000x10000 16-bit PNG among JPEGs, two workers each limited to 1200 MiB of address
    space: every copy becomes a record (none `corrupt` while its twins pass)."""
    src = tmp_path / "in"
    write_images(src, {"a": 3, "b": 3})
    deep_png(src / "a" / "deep0.png")
    for n in (1, 2):
        (src / "b" / f"deep{n}.png").write_bytes((src / "a" / "deep0.png").read_bytes())
    out = tmp_path / "out"
    done = run_cli("build", "--input", src, "--output", out, "--workers", "2", "--image-size", "64",
                   env=faults(rlimit_as=str(1200 * MIB)), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rejected(out) == {}
    assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["num_records"] == 9


@pytest.mark.slow
def test_a_worker_the_system_kills_is_retried_alone_and_then_stops_the_build_naming_the_file(tmp_path):
    """A SIGKILL is the system's, not the file's: killed once, the file becomes a record on the retry alone;
    killed every time, the build fails in one line naming it and the memory it needs, and rejects nothing."""
    src = tmp_path / "in"
    write_images(src, {"a": 8, "b": 8})
    args = ("--workers", "2", "--num-cores", "2")
    once = run_cli("build", "--input", src, "--output", tmp_path / "once", *args, env=faults(oom="b/img0003.jpg:1"))
    assert once.returncode == 0, once.stderr[-2000:]
    assert rejected(tmp_path / "once") == {}
    assert json.loads((tmp_path / "once" / "manifest.json").read_text())["splits"]["train"]["num_records"] == 16
    always = run_cli("build", "--input", src, "--output", tmp_path / "always", *args,
                     env=faults(oom="b/img0003.jpg:1000"))
    assert always.returncode == 1, always.stderr[-2000:]
    line = always.stderr.strip().splitlines()[-1]
    assert line.startswith("tpu-shards: error: b/img0003.jpg: the system killed the worker encoding it"), line
    assert "it needs about" in line and "corrupt" not in always.stderr
    assert not (tmp_path / "always" / "manifest.json").exists()
