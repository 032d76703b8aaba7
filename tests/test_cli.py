"""The command line: one-line errors, exit codes, nothing half-written.

Errors found before any pipeline exists run the command in this process (`in_process`); the cases
that need a pipeline, or the installed console script, start a subprocess.
"""
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_cli, run_job, write_images

from beam_jobs.cli import main


@pytest.fixture
def in_process(capsys):
    """Run `tpu-shards ARGS` in this process; returns (returncode, stdout, stderr) like run_cli."""
    def run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
    return run


def assert_one_line_error(done, *fragments):
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert len(lines) == 1 and lines[0].startswith("tpu-shards: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_input(in_process, tmp_path):
    done = in_process("build", "--input", tmp_path / "nope", "--output", tmp_path / "out")
    assert_one_line_error(done, "does not exist")
    assert done.returncode == 2 and not (tmp_path / "out").exists()


def test_empty_input(in_process, tmp_path):
    (tmp_path / "in").mkdir()
    assert_one_line_error(in_process("build", "--input", tmp_path / "in", "--output", tmp_path / "out"), "is empty")
    assert not (tmp_path / "out").exists()


def test_input_that_is_a_file(in_process, tmp_path):
    (tmp_path / "f").write_text("x")
    assert_one_line_error(in_process("build", "--input", tmp_path / "f", "--output", tmp_path / "out"), "not a folder")


def test_non_empty_output_needs_overwrite_and_is_left_alone(in_process, images, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert_one_line_error(in_process("build", "--input", images, "--output", out), "--overwrite")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_unwritable_output(in_process, images, tmp_path):
    (tmp_path / "file").write_text("x")
    assert_one_line_error(in_process("build", "--input", images, "--output", tmp_path / "file" / "out"),
                          "cannot create output folder")


def test_output_inside_input_is_refused(in_process, images):
    assert_one_line_error(in_process("build", "--input", images, "--output", images / "out"), "inside the input")


@pytest.mark.parametrize("args,fragment", [
    (["--splits", "train=0.9,val=0.2"], "add up to"),
    (["--splits", "train"], "name=fraction"),
    (["--image-size", "0"], "--image-size"),
    (["--image-size", "a,b"], "--image-size"),
    (["--num-shards", "12"], "multiple"),
    (["--jpeg-quality", "0"], "--jpeg-quality"),
    (["--background", "1,2"], "--background"),
])
def test_bad_options(in_process, images, tmp_path, args, fragment):
    done = in_process("build", "--input", images, "--output", tmp_path / "out", *args)
    assert_one_line_error(done, fragment)
    assert done.returncode == 2 and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("--direct_num_workers=2", "--direct_running_mode=multi_processing")])
def test_too_few_records_for_the_cores_fails_cleanly_and_writes_nothing(tmp_path, workers):
    """Also with worker processes: a planning failure is not raised inside a worker (which prints a traceback)."""
    write_images(tmp_path / "in", {"a": 3})
    done = run_cli("build", "--input", tmp_path / "in", "--output", tmp_path / "out", *workers)
    assert_one_line_error(done, "3 records cannot fill 8 shards")
    assert done.returncode == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["in_memory", "multi_threading"])
def test_a_build_on_several_of_beams_threads_in_this_process_writes_every_record(images, tmp_path, mode):
    """Beam's bundles on two threads of this process (once an internal error or a hang: the encode pool was
    driven from both): the encode step runs inline in each."""
    m = run_job(images, tmp_path / "out", "--direct_num_workers=2", f"--direct_running_mode={mode}")
    assert m.splits["train"].num_records == 36 and len(m.splits["train"].shards) == 8


@pytest.mark.slow
def test_all_files_rejected_fails_cleanly(tmp_path):
    (tmp_path / "in" / "a").mkdir(parents=True)
    (tmp_path / "in" / "a" / "x.jpg").write_text("not an image")
    done = run_cli("build", "--input", tmp_path / "in", "--output", tmp_path / "out")
    assert_one_line_error(done, "0 records")


@pytest.mark.slow
def test_failed_rerun_keeps_the_previous_dataset(images, tmp_path):
    out = tmp_path / "out"
    assert run_cli("build", "--input", images, "--output", out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    small = tmp_path / "small"
    write_images(small, {"a": 2})
    assert_one_line_error(run_cli("build", "--input", small, "--output", out, "--overwrite"), "cannot fill")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.slow
def test_console_entry_point_and_help(tmp_path):
    assert run_cli("build", "--help").returncode == 0
    done = run_cli()
    assert done.returncode == 2 and "usage: tpu-shards" in done.stderr
    exe = Path(sys.executable).parent / "tpu-shards"  # the console script pip installed beside this Python
    done = subprocess.run([str(exe), "verify", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1 and "no readable manifest" in done.stderr


def test_an_unknown_command_is_one_line_naming_the_closest(in_process):
    done = in_process("biuld", "--input", "x")
    assert done.returncode == 2 and done.stderr == "tpu-shards: error: unknown command biuld; did you mean build?\n"
    done = in_process("frobnicate")
    assert done.returncode == 2 and done.stderr == (
        "tpu-shards: error: unknown command frobnicate (commands: build, verify, inspect, extract, reshard)\n")


def test_help_lists_every_command_with_a_line_saying_what_it_does(in_process):
    done = in_process("--help")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[lines.index("commands:") + 1:]}
    assert list(listed) == ["build", "verify", "inspect", "extract", "reshard"]
    assert listed["verify"].startswith("check a dataset against its manifest") and all(map(len, listed.values()))


@pytest.mark.parametrize("argv,typo,hint", [
    (["verify", "ds", "--depp"], "--depp", "--deep"),
    (["inspect", "ds", "--reprot", "r"], "--reprot", "--report"),
    (["extract", "ds", "dir", "--splt", "train"], "--splt", "--split"),
    (["reshard", "a", "b", "--num-core", "2"], "--num-core", "--num-cores"),
    (["build", "--input", "a", "--output", "b", "--overwirte"], "--overwirte", "--overwrite"),
])
def test_every_command_names_the_closest_option_to_an_unknown_one(in_process, tmp_path, argv, typo, hint):
    done = in_process(*argv)
    assert done.returncode == 2
    assert done.stderr == f"tpu-shards: error: unknown option {typo}; did you mean {hint}?\n"


@pytest.mark.parametrize("argv,fragment", [
    (["verify", "ds", "--deep", "--deep"], "--deep is given twice; give it once"),
    (["inspect", "ds", "--seed", "1", "--seed", "2", "--report", "r"], "--seed is given twice"),
    (["inspect", "ds", "--max-records", "10"], "--max-records is for the report; add --report DIR or drop it"),
    (["inspect", "ds", "--seed", "3"], "--seed is for the report"),
    (["inspect", "ds", "--report", "r", "--max-records", "0"], "--max-records must be at least 1"),
    (["inspect", "ds", "--report", "r", "--croissant"], "--croissant prints or writes the Croissant description"),
    (["inspect", "ds", "--write-croissant", "--report", "r"], "--write-croissant prints or writes"),
    (["extract", "ds", "dir", "--split", "train", "--split", "validation"], "--split is given twice"),
    (["extract", "ds", "dir", "--limit=1", "--limit", "2"], "--limit is given twice"),
    (["reshard", "a", "b", "--num-cores", "4", "--num-cores", "2"], "--num-cores is given twice"),
    (["reshard", "a", "b", "c"], "unrecognized argument 'c': no option takes it"),  # Beam would drop it
    (["reshard", "a", "b", "--seed", str(-2**70)], f"--seed {-2**70} must be an integer of at most 64 bits"),
    (["build", "--input", "a", "--output", "b", "--listing", "x.csv", "--input", "c"], "--input is given twice"),
    (["build", "--input", "a", "--output", ""], "--output is empty"),
    (["build", "--input=", "--output", "b", "--listing", "x.csv"], "--input is empty"),  # not "is required"
    (["reshard", "a", ""], "DST is empty"),
])
def test_a_repeated_contradictory_or_ignored_option_is_one_line_before_any_work(in_process, tmp_path, argv,
                                                                                fragment):
    """argparse keeps the last of a repeated option and Beam drops a stray word: each would run silently with
    something the user did not mean."""
    done = in_process(*[str(tmp_path / a) if a in ("ds", "dir", "r", "a", "b") else a for a in argv])
    assert_one_line_error(done, fragment)
    assert done.returncode == 2 and not done.stdout and list(tmp_path.iterdir()) == []


def test_build_help_says_workers_are_refused_on_dataflow(in_process):
    done = in_process("build", "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "Refused above 1 on Dataflow" in text and "Ignored" not in text


@pytest.mark.slow
def test_options_beam_refuses_are_one_line_and_exit_2_without_beams_warnings(images, tmp_path):
    """A project id Beam refuses printed Beam's warnings and `internal error: ValueError: Pipeline has validations
    errors`, exit 3. Beam's validator now runs before any work; its warnings (here about the bucket) stay out."""
    template = tmp_path / "t.json"
    done = run_cli("build", "--input", images, "--output", tmp_path / "out", "--runner", "DataflowRunner",
                   "--project", "p", "--temp_location", "gs://Bad_/tmp", "--template_location", template)
    assert_one_line_error(done, "Beam refuses these options: Invalid GCS bucket (gs://Bad_/tmp), given for the option: "
                          "temp_location", "Invalid Project ID (p)", "Missing required option: region")
    assert done.returncode == 2 and "WARNING" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "out").exists() and not template.exists()


def test_progress_forced_without_tqdm_is_one_line_and_exit_2(images, tmp_path):
    """An install made with --no-deps may lack tqdm: asking for bars is then a user's error, not a bug."""
    from base_install import environment

    done = run_cli("build", "--input", images, "--output", tmp_path / "out", "--progress",
                   env=environment(tmp_path / "site", {"tqdm"}))
    assert_one_line_error(done, "--progress needs tqdm, which is not installed: pip install -e")
    assert done.returncode == 2 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_listing_of_ids_is_refused_before_any_work_saying_what_path_template_does(in_process, tmp_path):
    """Kaggle's train.csv holds ids (`id,label`): without --path-template every file would be missing."""
    write_images(tmp_path / "in", {"x": 3})
    (tmp_path / "train.csv").write_text("id,label\n" + "".join(f"x/img{i:04d},x\n" for i in range(3)))
    args = ["build", "--listing", tmp_path / "train.csv", "--input", tmp_path / "in", "--output", tmp_path / "out",
            "--num-cores", "1"]
    done = in_process(*args)
    assert_one_line_error(done, f"listing train.csv line 2: {tmp_path / 'in'}/x/img0000 does not exist, nor does any "
                                "file its first 3 rows name", "if column 'id' holds ids, --path-template maps them "
                                f"to files, e.g. --path-template '{{}}.jpg' ({tmp_path / 'in'}/x/img0000.jpg exists)")
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert in_process(*args, "--path-template", "{}.jpg").returncode == 0


def test_version_prints_the_package_version(in_process):
    from shard_utils import __version__

    done = in_process("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"tpu-shards {__version__}\n", "")
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_layouts_are_counted_in_the_singular_where_they_are_one():
    from shard_utils.format.topology import cores_x_hosts

    assert [cores_x_hosts(8, 1), cores_x_hosts(1, 4), cores_x_hosts(4, 2)] == [
        "8 cores x 1 host", "1 core x 4 hosts", "4 cores x 2 hosts"]


@pytest.mark.parametrize("name,usual", [
    ("valid", "validation"), ("val", "validation"), ("eval", "validation"), ("dev", "validation"),
    ("validaton", "validation"), ("trian", "train"), ("tain", "train"), ("Train", "train"), ("tests", "test"),
    ("train", None), ("validation", None), ("fold0", None), ("holdout", None), ("testing", None)])
def test_a_split_name_one_edit_from_a_usual_one_gets_a_note(name, usual):
    from beam_jobs.jobs.summary import split_name_notes

    notes = split_name_notes([name])
    assert notes == ([f"  note: split {name!r} is not {usual!r}; loaders asking for {usual!r} will not find it"]
                     if usual else [])
