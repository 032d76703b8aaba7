"""Every option is checked before any pipeline exists: one line, the right exit code, nothing written.

These run the command line in this process (no Beam subprocess): errors found before the pipeline is
built need no runner.
"""
import logging
from dataclasses import fields, replace

import pytest
from conftest import run_job

from beam_jobs.cli import main
from beam_jobs.errors import UsageError
from beam_jobs.jobs import options
from beam_jobs.run.config import BuildConfig, DatasetSpec, RejectLimit, RunSettings
from shard_utils.errors import InternalError
from shard_utils.format.image_size import ImageSize, parse_image_size


def one_line_error(capsys, argv, *fragments, code=2):
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tpu-shards: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("typo,hint", [
    ("--overwirte", "--overwrite"),
    ("--imagesize", "--image-size"),
    ("--num_core", "--num-cores"),
    ("--input_dir", "--input"),
    ("--runer", "--runner"),
])
def test_unknown_options_are_refused_with_the_closest_one(capsys, images, tmp_path, typo, hint):
    line = one_line_error(capsys, ["build", "--input", str(images), "--output", str(tmp_path / "out"), typo],
                          f"unknown option {typo}", f"did you mean {hint}?")
    assert "Unparseable" not in line
    assert not (tmp_path / "out").exists()


def test_an_unknown_option_far_from_any_is_still_refused(capsys, images, tmp_path):
    one_line_error(capsys, ["build", "--input", str(images), "--output", str(tmp_path / "o"), "--zzzz=1"],
                   "unknown option --zzzz")


@pytest.mark.parametrize("argv,fragment", [
    (["--resize", "crop"], "argument --resize: invalid choice: 'crop'"),
    (["--jpeg-quality", "high"], "argument --jpeg-quality: invalid int value"),
    (["--max-rejected", "lots"], "--max-rejected 'lots'"),
    (["--max-rejected", "150%"], "--max-rejected '150%'"),
    (["--label-offset", "-1"], "--label-offset"),
    (["--shard-extension", "rec"], "argument --shard-extension"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--target-shard-mb", "0"], "--target-shard-mb"),
    (["--num-cores", "0"], "--num-cores"),
    (["--hash-bucket-bits", "30"], "--hash-bucket-bits"),
    (["--splits", "train=0.5,train-g001=0.5"], "split name 'train-g001' ends like the name of a generation"),
    (["--workers", "10000"], "--workers 10000 is more than this machine can run: at most"),
    (["--worker-memory-mb", "100"], "--worker-memory-mb 100 must be in 1024..1048576"),
    (["--max-pixels", "300000000"], "--max-pixels 300000000 is more than any image fits in --worker-memory-mb 1024"),
    (["--near-dups", "merge"], "argument --near-dups: invalid choice: 'merge'"),
    (["--image-size", "0"], "--image-size '0' must be 1 or 2 integers in 1..65535"),
    (["--image-size", "16,16,3"], "--image-size '16,16,3' must be 1 or 2 integers in 1..65535"),
    (["--image-size", "20000,20000"], "--image-size 20000x20000 is more than 268435456 pixels per image"),
    (["--near-dups", "group", "--quality-checks", "off"], "--near-dups group needs every image's signature"),
    (["--near-dups", "drop", "--validate", "structure"], "--near-dups drop needs every image's signature"),
    (["--splits", ""], "--splits is empty"),  # an empty value is never taken for the default
    (["--image-size", ""], "--image-size '' must be 1 or 2 integers"),
    (["--seed", str(2**64)], f"--seed {2**64} must be an integer of at most 64 bits"),
    (["--seed", "1", "--seed", "2"], "--seed is given twice"),  # argparse would keep the last without a word
    (["--image_size", "8", "--image-size", "16"], "--image-size is given twice"),
    (["--output=elsewhere"], "--output is given twice"),
    (["--progress", "--no-progress"], "--progress and --no-progress are both given"),
    (["--image-size", "224", "224"], "unrecognized argument '224': no option takes it"),  # Beam would drop it
    (["--workers", "2", "--direct_num_workers=2"], "--workers 2 needs Beam's bundles run by one thread"),
    (["--embed-batch-size", "0"], "--embed-batch-size needs --embed-model"),  # once ignored without a word
    (["--embed-key", "x"], "--embed-key needs --embed-model"),
    (["--listing", ""], "--listing is empty"),
])
def test_bad_values_are_one_line(capsys, images, tmp_path, argv, fragment):
    one_line_error(capsys, ["build", "--input", str(images), "--output", str(tmp_path / "out"), *argv], fragment)
    assert not (tmp_path / "out").exists()


def test_an_image_size_is_parsed_once_into_the_form_it_is_carried_in():
    """--image-size "H" or "H,W" becomes (height, width) at parsing; the manifest records it as [height, width]."""
    assert parse_image_size("224") == ImageSize(224, 224) and parse_image_size("224,160") == ImageSize(224, 160)
    assert list(parse_image_size("32,16")) == [32, 16]


def test_the_config_is_what_shapes_the_dataset_and_how_the_run_executes():
    """BuildConfig's two halves share no field, and nothing of how the run executes reaches the manifest."""
    dataset, execution = {f.name for f in fields(DatasetSpec)}, {f.name for f in fields(RunSettings)}
    assert not dataset & execution and {f.name for f in fields(BuildConfig)} == dataset | execution
    config = BuildConfig(input="in", output="out", temp_root="tmp")
    other = replace(config, output="elsewhere", temp_root="t2", run_id="r", created="c", lease_seconds=1,
                    overwrite=True, workers=7, bucket_bits=3, fragment_bytes=5, run_part_bytes=9, local=True)
    assert other.manifest_options() == config.manifest_options()
    assert not set(config.manifest_options()) & execution


def test_a_missing_required_option_is_one_line(capsys, images):
    one_line_error(capsys, ["build", "--input", str(images)], "the following arguments are required: --output")


def test_verify_and_inspect_arguments_are_one_line_too(capsys):
    one_line_error(capsys, ["verify"], "the following arguments are required: dataset")
    one_line_error(capsys, ["inspect", "a", "--bogus"], "unknown option --bogus (see tpu-shards inspect --help)")


@pytest.mark.slow
def test_underscore_spellings_of_our_options_are_aliases(images, tmp_path):
    m = run_job(images, tmp_path / "out", "--image_size", "24", "--jpeg_quality=50", "--num_cores", "4")
    assert m.image_size == [24, 24] and m.options["jpeg_quality"] == 50 and m.num_cores == 4
    assert len(m.splits["train"].shards) % 4 == 0


def test_beams_own_options_pass_through():
    args, beam_args = options.parse(["--input", "i", "--output", "o", "--runner", "FnApiRunner",
                                     "--direct_num_workers=2", "--no_pipeline_type_check"])
    assert args.input == "i" and beam_args == ["--runner", "FnApiRunner", "--direct_num_workers=2",
                                               "--no_pipeline_type_check"]


def test_a_local_run_skips_beams_type_inference_and_a_remote_one_keeps_it():
    from apache_beam.options.pipeline_options import TypeOptions

    from beam_jobs.jobs.checks import pipeline_options

    assert pipeline_options([]).view_as(TypeOptions).pipeline_type_check is False
    assert pipeline_options(["--runner=DataflowRunner"]).view_as(TypeOptions).pipeline_type_check is True


def test_reject_limits():
    assert options.reject_limit("0") == RejectLimit(count=0)
    assert options.reject_limit("5%") == RejectLimit(fraction=0.05)
    assert RejectLimit(count=2).exceeded(3, 100) and not RejectLimit(count=2).exceeded(2, 100)
    assert RejectLimit(fraction=0.5).exceeded(6, 10) and not RejectLimit(fraction=0.5).exceeded(5, 10)
    assert not RejectLimit(fraction=1.0).exceeded(10, 10)


@pytest.mark.parametrize("requested,runner,direct,mode,cores,expected", [
    (None, "FnApiRunner", 1, "", 8, 8),  # locally: every core
    (3, "FnApiRunner", 1, "", 8, 3),
    (None, "FnApiRunner", 4, "multi_processing", 8, 2),  # Beam's own processes share the cores
    (None, "FnApiRunner", 4, "multi_threading", 8, 1),  # Beam's threads in this process: the encode step inline
    (None, "FnApiRunner", 2, "in_memory", 8, 1),
    (None, "FnApiRunner", 0, "in_memory", 8, 1),  # 0: Beam takes a thread per core
    (1, "FnApiRunner", 2, "multi_threading", 8, 1),
    (None, "DataflowRunner", 1, "", 96, 1),  # one SDK process per vCPU already: never a pool
    (1, "DataflowRunner", 1, "", 96, 1),
])
def test_how_many_encode_processes(requested, runner, direct, mode, cores, expected):
    assert options.local_workers(requested, runner, direct, mode, cores) == expected


def test_workers_are_bounded_by_cores_and_by_memory_and_the_bound_is_named():
    gib = 1 << 30
    assert options.local_workers(None, "FnApiRunner", 1, "", 8, memory=3 * gib + 5, budget=gib) == 3
    assert options.local_workers(None, "FnApiRunner", 1, "", 8, memory=100 * gib, budget=gib) == 8
    assert options.local_workers(None, "FnApiRunner", 1, "", 8, memory=gib // 2, budget=gib) == 1
    with pytest.raises(UsageError, match=r"--workers 4 is more than this machine can run: at most 3 "
                                         r"\(3073 MiB of memory free, 1024 MiB per worker\)"):
        options.local_workers(4, "FnApiRunner", 1, "", 8, memory=3 * gib + 5, budget=gib)
    with pytest.raises(UsageError, match=r"at most 8 \(8 cores\)"):
        options.local_workers(9, "FnApiRunner", 1, "", 8)


def test_free_memory_is_read_from_this_machine():
    free = options.available_memory()
    assert free is not None and 0 < free < 1 << 50


def test_workers_on_dataflow_is_refused():
    with pytest.raises(UsageError, match="--workers is for local builds"):
        options.local_workers(4, "DataflowRunner", 1, "", 8)


def test_internal_consistency_failures_are_not_reported_as_bad_input(capsys):
    from beam_jobs.errors import guarded

    def broken(argv):
        raise InternalError("shard 3 of split 'train' got 5 records, planned 6")

    assert guarded(broken, []) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("tpu-shards: internal error: InternalError: shard 3") and "\n" not in err


@pytest.mark.slow
def test_a_tpu_by_name_sets_cores_and_hosts_and_is_recorded(images, tmp_path):
    assert options.tpu_layout("v4-32", None, None) == ("v4-32", 4, 4)
    assert options.tpu_layout("V5litepod-16", None, None) == ("v5e-16", 4, 4)
    assert options.tpu_layout(None, None, None) == (None, 8, 1)
    m = run_job(images, tmp_path / "out", "--tpu", "v5e-4", "--image-size", "16")
    assert (m.tpu, m.num_cores, m.num_hosts) == ("v5e-4", 4, 1) and len(m.splits["train"].shards) % 4 == 0
    untagged = run_job(images, tmp_path / "plain", "--num-cores", "2", "--image-size", "16")
    assert untagged.tpu is None  # a manifest without a TPU name loads as before


@pytest.mark.parametrize("argv,fragments", [
    (["--tpu", "v5e-12"], ["--tpu: unknown TPU type 'v5e-12'", "v5e-8, v5e-16"]),
    (["--tpu", "v9-8"], ["--tpu: unknown TPU type 'v9-8'", "v4-N and v5p-N"]),
    (["--tpu", "v4-32", "--num-cores", "4"], ["--tpu sets the cores and hosts; drop --num-cores"]),
])
def test_unknown_tpu_names_and_conflicts_are_one_line(capsys, images, tmp_path, argv, fragments):
    one_line_error(capsys, ["build", "--input", str(images), "--output", str(tmp_path / "out"), *argv], *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["build", "reshard"])
@pytest.mark.parametrize("beam_args, fragment", [
    (["--runner", "Foo"], "--runner Foo: not a Beam runner"),
    (["--runner", "DataflowRuner"], "did you mean DataflowRunner?"),
    (["--direct_num_workers", "abc"], "argument --direct_num_workers: invalid int value: 'abc'"),
])
def test_beam_options_beam_refuses_are_one_line_and_exit_2(command, beam_args, fragment, tmp_path, capsys):
    """Beam's own parser prints its whole usage block and an unknown runner surfaced as an internal error."""
    out = tmp_path / "out"
    argv = {"build": ["build", "--input", str(tmp_path), "--output", str(out)],
            "reshard": ["reshard", str(tmp_path), str(out)]}[command]
    assert main(argv + beam_args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-shards: error: ") and fragment in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize("beam_args, fragment", [
    (["--project", "p", "--template_location", "gs://b-unused/t.json"],
     "Beam refuses these options: Missing GCS path option: temp_location; Missing GCS path option: "
     "staging_location; Invalid Project ID (p). Please make sure you specified the Project ID, not project "
     "description; Missing required option: region"),
    (["--project", "my-project", "--temp_location", "gs://Bad_/t", "--num_workers", "5", "--max_num_workers", "2"],
     "Invalid GCS bucket (gs://Bad_/t), given for the option: temp_location"),
    (["--project", "my-project", "--temp_location", "gs://Bad_/t", "--num_workers", "5", "--max_num_workers", "2"],
     "; num_workers (5) cannot exceed max_num_workers (2)"),
])
def test_options_beams_validator_refuses_are_one_line_before_any_work(beam_args, fragment, images, tmp_path, capsys,
                                                                      monkeypatch, caplog):
    """Beam's validator ran when the pipeline was made, after the output was prepared, and its "Pipeline has
    validations errors" was an internal error. Its warnings about the refused options are not shown.
    (No gcloud on PATH: Beam asks it for a default region, a few seconds.)"""
    monkeypatch.setenv("PATH", str(tmp_path / "no-gcloud"))
    out = tmp_path / "out"
    assert main(["build", "--input", str(images), "--output", str(out), "--runner", "DataflowRunner", *beam_args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-shards: error: ") and fragment in lines[0], lines
    assert not out.exists()
    assert not [r for r in caplog.records if r.name.startswith("apache_beam") and r.levelno >= logging.WARNING]


def test_the_jobs_own_options_are_checked_before_beams(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "no-gcloud"))
    assert main(["build", "--output", str(tmp_path / "out"), "--runner", "DataflowRunner", "--project", "p"]) == 2
    assert capsys.readouterr().err.strip() == \
        "tpu-shards: error: the following arguments are required: --input (or --listing)"


def test_beams_warnings_about_options_it_accepts_are_still_shown(caplog):
    from beam_jobs.jobs.checks import beam_logs_held

    with beam_logs_held() as held:
        logging.getLogger("apache_beam.options.pipeline_options").warning("kept for later")
        assert [r.getMessage() for r in held] == ["kept for later"]
        assert "kept for later" not in caplog.text
    assert "kept for later" in caplog.text
    with beam_logs_held() as held:
        logging.getLogger("apache_beam.options.pipeline_options").warning("dropped")
        held.clear()
    assert "dropped" not in caplog.text
