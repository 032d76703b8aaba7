"""The Flex Template and worker image, checked without a cloud: build context, pins, metadata, entry point.

No container is built unless a container engine answers (`docker info`); no Dataflow job is launched.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import apache_beam
import pytest
from conftest import REPO, write_images
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from beam_jobs.errors import UsageError
from beam_jobs.jobs import flex_launch
from beam_jobs.jobs.flex_metadata import job_options, job_parser, render
from beam_jobs.jobs.options import make_config

DOCKERFILE = REPO / "dataflow" / "Dockerfile"
METADATA = REPO / "dataflow" / "metadata.json"
MAIN = REPO / "dataflow" / "main.py"

# ParameterMetadata as the Dataflow API defines it (gcloud's generated dataflow v1b3 messages list the same).
PARAMETER_FIELDS = {"name", "label", "helpText", "isOptional", "regexes", "paramType", "customMetadata",
                    "groupName", "parentName", "parentTriggerValues", "enumOptions", "defaultValue", "hiddenUi"}
PARAM_TYPES = {"DEFAULT", "TEXT", "GCS_READ_BUCKET", "GCS_WRITE_BUCKET", "GCS_READ_FILE", "GCS_WRITE_FILE",
               "GCS_READ_FOLDER", "GCS_WRITE_FOLDER", "PUBSUB_TOPIC", "PUBSUB_SUBSCRIPTION", "BIGQUERY_TABLE",
               "JAVASCRIPT_UDF_FILE", "SERVICE_ACCOUNT", "MACHINE_TYPE", "KMS_KEY_NAME", "WORKER_REGION",
               "WORKER_ZONE", "BOOLEAN", "ENUM", "NUMBER", "KAFKA_TOPIC", "KAFKA_READ_TOPIC", "KAFKA_WRITE_TOPIC"}


# --- Dockerfile and build context ---------------------------------------------------------------------

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = current.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            current = ""
    return out


def global_args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """ARG defaults declared before the first FROM (the ones FROM lines can use)."""
    values = {}
    for word, rest in instructions:
        if word == "FROM":
            break
        if word == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            values[name] = value.strip('"')
    return values


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], text)


def pattern_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex: `*` and `?` stay within a folder, `**` spans folders."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        regex = pattern_regex(pattern.lstrip("!").strip("/"))
        if any(re.fullmatch(regex, c) for c in candidates):
            excluded = not pattern.startswith("!")
    return excluded


def dockerignore() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_dockerignore_matcher_follows_docker_rules():
    patterns = ["*", "!beam_jobs", "!dataflow/main.py", "**/__pycache__"]
    assert dockerignore_excludes("tests/test_x.py", patterns)
    assert not dockerignore_excludes("beam_jobs/cli.py", patterns)
    assert dockerignore_excludes("beam_jobs/__pycache__/cli.cpython-311.pyc", patterns)
    assert not dockerignore_excludes("dataflow/main.py", patterns)
    assert dockerignore_excludes("dataflow/Dockerfile", patterns)


def test_every_copy_source_is_in_the_build_context():
    """Each COPY/ADD source exists under the repository root and .dockerignore does not drop it."""
    patterns = dockerignore()
    sources = []
    for word, rest in dockerfile_instructions(DOCKERFILE):
        if word in ("COPY", "ADD"):
            args = rest.split()
            if any(a.startswith("--from=") for a in args):
                continue
            sources += [a for a in args if not a.startswith("--")][:-1]
    assert {"setup.py", "beam_jobs", "shard_utils", "dataflow/main.py"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), f"COPY source {source} missing from the build context"
        assert not dockerignore_excludes(source, patterns), f".dockerignore drops COPY source {source}"
    for package in ("beam_jobs", "shard_utils"):  # setup.py's packages, all of them in the image
        for module in (REPO / package).rglob("*.py"):
            relative = module.relative_to(REPO).as_posix()
            assert not dockerignore_excludes(relative, patterns), relative
    assert dockerignore_excludes("tests/conftest.py", patterns)  # the context stays small
    assert dockerignore_excludes(".git/HEAD", patterns)


def setup_py_requirements() -> tuple[SpecifierSet, SpecifierSet]:
    """(apache-beam's version specifier, python_requires) from setup.py's text."""
    text = (REPO / "setup.py").read_text()
    beam = re.search(r'"apache-beam(?:\[[^\]]*\])?([^"]+)"', text).group(1)
    python = re.search(r'python_requires="([^"]+)"', text).group(1)
    return SpecifierSet(beam), SpecifierSet(python)


def test_base_images_are_pinned_to_the_beam_and_python_of_setup_py():
    instructions = dockerfile_instructions(DOCKERFILE)
    args = global_args(instructions)
    images = [expand(rest.split()[0], args) for word, rest in instructions if word == "FROM"]
    sdk = [i for i in images if i.startswith("apache/beam_python")]
    launcher = [i for i in images if "template-launcher-base" in i]
    assert len(sdk) == 1 and len(launcher) == 1, images
    match = re.fullmatch(r"apache/beam_python(\d+)\.(\d+)_sdk:(\d+\.\d+\.\d+)", sdk[0])
    assert match, sdk[0]
    major, minor, beam_version = match.groups()
    beam_spec, python_spec = setup_py_requirements()
    assert Version(beam_version) in beam_spec
    assert beam_version == apache_beam.__version__  # the Beam that builds job graphs here is the workers' Beam
    assert Version(f"{major}.{minor}") in python_spec
    assert f"/python{major}{minor}-template-launcher-base:" in launcher[0]
    assert images.index(launcher[0]) < images.index(sdk[0])  # the SDK image is the final stage
    run = " ".join(rest for word, rest in instructions if word == "RUN")
    assert '"apache-beam[gcp]==${BEAM_VERSION}"' in run  # pip may not swap the image's Beam


def test_image_launches_without_installing_anything():
    instructions = dockerfile_instructions(DOCKERFILE)
    env = dict(rest.split("=", 1) for word, rest in instructions if word == "ENV")
    assert env["FLEX_TEMPLATE_PYTHON_PY_FILE"] == "/template/main.py"
    assert "FLEX_TEMPLATE_PYTHON_REQUIREMENTS_FILE" not in env and "FLEX_TEMPLATE_PYTHON_SETUP_FILE" not in env
    copies = [rest for word, rest in instructions if word == "COPY"]
    assert "dataflow/main.py /template/main.py" in copies
    assert any(c.startswith("--from=launcher /opt/google/dataflow/python_template_launcher") for c in copies)
    assert ("ENTRYPOINT", '["/opt/apache/beam/boot"]') in instructions


def test_cloud_build_config_builds_this_dockerfile():
    text = (REPO / "dataflow" / "cloudbuild.yaml").read_text()
    assert '"-f", "dataflow/Dockerfile"' in text and text.rstrip().count('"."') >= 1


# --- metadata.json ------------------------------------------------------------------------------------

def test_committed_metadata_is_what_the_parser_generates():
    """dataflow/metadata.json can never drift from the job's options: regenerate it when they change
    (python -m beam_jobs.jobs.flex_metadata > dataflow/metadata.json)."""
    assert METADATA.read_text() == render()
    done = subprocess.run([sys.executable, "-m", "beam_jobs.jobs.flex_metadata"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == METADATA.read_text()


def test_parameters_are_exactly_the_job_options():
    names = [p["name"] for p in json.loads(METADATA.read_text())["parameters"]]
    options = [a.dest for a in job_options(job_parser())]
    assert names == options
    assert {"input", "output", "image_size", "overwrite"} <= set(names)


def test_metadata_fields_follow_the_dataflow_schema():
    doc = json.loads(METADATA.read_text())
    assert doc["name"] and doc["description"]
    by_dest = {a.dest: a for a in job_options(job_parser())}
    for p in doc["parameters"]:
        assert set(p) <= PARAMETER_FIELDS, set(p) - PARAMETER_FIELDS
        assert p["name"] and p["label"] and p["helpText"], p
        assert re.fullmatch(r"[a-z][a-z0-9_]*", p["name"])
        assert p["paramType"] in PARAM_TYPES
        action = by_dest[p["name"]]
        assert p["isOptional"] is (not action.required)
        for regex in p.get("regexes", []):
            re.compile(regex)
            if "defaultValue" in p:  # the console's pre-filled value must pass the template's own check
                assert re.fullmatch(regex, p["defaultValue"]), (p["name"], regex)
        if action.choices:
            assert p["paramType"] == "ENUM"
            assert [o["value"] for o in p["enumOptions"]] == list(action.choices)
            assert all(re.fullmatch(p["regexes"][0], c) for c in action.choices)
            assert not re.fullmatch(p["regexes"][0], "nonsense")
    by_name = {p["name"]: p for p in doc["parameters"]}
    assert by_name["input"]["paramType"] == "GCS_READ_FOLDER"
    assert by_name["output"]["paramType"] == "GCS_WRITE_FOLDER"
    assert not re.fullmatch(by_name["input"]["regexes"][0], "/local/folder")
    assert by_name["overwrite"]["paramType"] == "BOOLEAN" and by_name["overwrite"]["defaultValue"] == "false"
    assert re.fullmatch(by_name["jpeg_quality"]["regexes"][0], "90")
    assert not re.fullmatch(by_name["jpeg_quality"]["regexes"][0], "ninety")


def test_format_regexes_accept_what_the_job_accepts(tmp_path):
    """image_size and background: a value the regex admits is one the job's own check accepts."""
    by_name = {p["name"]: p for p in json.loads(METADATA.read_text())["parameters"]}
    for name, value in [("image_size", "224"), ("image_size", "224,320"), ("background", "0,128,255")]:
        assert re.fullmatch(by_name[name]["regexes"][0], value)
        args, _ = job_parser().parse_known_args(
            flex_launch.flex_argv(["--input=gs://b/in", "--output=gs://b/out", f"--{name}={value}"]))
        config = make_config(args, split_dirs=False, workers=1, temp_root="gs://b/t", run_id=None, created=None)
        expected = {"224": (224, 224), "224,320": (224, 320), "0,128,255": (0, 128, 255)}[value]
        assert (config.image.size if name == "image_size" else config.image.background) == expected
    assert not re.fullmatch(by_name["image_size"]["regexes"][0], "224x320")


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="gcloud is not installed")
def test_gcloud_builds_the_template_spec_from_the_metadata(tmp_path):
    """gcloud's own parser (offline, --print-only) takes the metadata and keeps every field."""
    done = subprocess.run(
        ["gcloud", "dataflow", "flex-template", "build", "gs://unused-bucket/tpu-shards.json",
         "--image=europe-west4-docker.pkg.dev/p/r/tpu-shards:test", "--sdk-language=PYTHON",
         f"--metadata-file={METADATA}", "--print-only"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
             "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    spec = json.loads(done.stdout[done.stdout.index("{"):])
    assert spec["sdkInfo"] == {"language": "PYTHON"}
    assert spec["metadata"] == json.loads(METADATA.read_text())


# --- the launcher's arguments -------------------------------------------------------------------------

def test_launcher_parameters_become_the_job_options():
    """Every parameter, as the launcher passes it (--name=value), parses to the typed value the CLI gives."""
    doc = json.loads(METADATA.read_text())
    samples = {"input": "gs://b/in", "output": "gs://b/out", "splits": "train=0.9,validation=0.1",
               "image_size": "224,320", "num_shards": "16", "overwrite": "true"}
    flex = [f"--{p['name']}={samples.get(p['name'], p.get('defaultValue'))}" for p in doc["parameters"]
            if p["name"] in samples or "defaultValue" in p]
    beam = ["--runner=DataflowRunner", "--temp_location=gs://t/tmp", "--template_location=gs://t/job_object"]
    args, rest = job_parser().parse_known_args(flex_launch.flex_argv(flex + beam))
    assert rest == beam  # Beam's options pass through untouched, in order
    assert args.input == "gs://b/in" and args.image_size == "224,320" and args.num_shards == 16
    assert args.jpeg_quality == 95 and args.target_shard_mb == 128.0 and args.resize == "fill"
    assert args.splits == "train=0.9,validation=0.1" and args.overwrite is True


@pytest.mark.parametrize("value, expected", [("true", True), ("TRUE", True), ("false", False), ("False", False)])
def test_boolean_flags_accept_true_and_false(value, expected):
    argv = flex_launch.flex_argv(["--input=gs://b/in", "--output=gs://b/out", f"--overwrite={value}"])
    assert ("--overwrite" in argv) is expected
    assert job_parser().parse_args(argv).overwrite is expected


def test_cli_spellings_pass_unchanged():
    argv = ["--input", "gs://b/in", "--output=gs://b/out", "--image-size=224", "--overwrite", "--seed", "3"]
    assert flex_launch.flex_argv(argv) == argv


def test_a_bad_boolean_is_a_usage_error():
    with pytest.raises(UsageError, match=r"--overwrite must be true or false, not 'yes'"):
        flex_launch.flex_argv(["--overwrite=yes"])


def test_runner_defaults_to_dataflow_and_needs_the_worker_image():
    base = ["--input=gs://b/in", "--output=gs://b/out"]
    assert flex_launch.launch_argv(base + ["--sdk_container_image=img"])[-1] == "--runner=DataflowRunner"
    with pytest.raises(UsageError, match="sdk_container_image"):
        flex_launch.launch_argv(base)
    assert flex_launch.launch_argv(base + ["--runner", "FnApiRunner"])[-2:] == ["--runner", "FnApiRunner"]


# --- dataflow/main.py as the launcher runs it ---------------------------------------------------------

def run_main(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run dataflow/main.py the way the launcher does: `python main.py --name=value ...`, not from the repo."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, str(MAIN), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=180)


@pytest.mark.slow
def test_main_help_lists_every_option(tmp_path):
    done = run_main("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for action in job_options(job_parser()):
        assert action.option_strings[0] in done.stdout


@pytest.mark.parametrize("args, message", [
    (("--input=gs://b/in", "--output=gs://b/out", "--overwrite=maybe"),
     "tpu-shards: error: --overwrite must be true or false, not 'maybe'"),
    (("--input=gs://b/in", "--output=gs://b/out", "--jpeg_quality=high"),
     "tpu-shards: error: argument --jpeg-quality: invalid int value: 'high'"),
    (("--output=gs://b/out",), "tpu-shards: error: the following arguments are required: --input (or --listing)"),
])
def test_launch_errors_are_one_line(args, message, capsys):
    """The launch checks in flex_launch.main, in process (the subprocess test below covers main.py itself)."""
    image = "--sdk_container_image=europe-west4-docker.pkg.dev/p/r/tpu-shards:1"
    assert flex_launch.main([*args, image]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]


@pytest.mark.slow
def test_main_reports_a_bad_parameter_in_one_line(tmp_path):
    images = tmp_path / "images"
    write_images(images, {"cat": 1}, size=(16, 16))
    cases = {
        ("--input=gs://b/in", "--output=gs://b/out"):  # no worker image: refused before any cloud call
            "tpu-shards: error: Dataflow workers need this package: pass sdk_container_image=IMAGE",
        # past the launch checks: the job's own validation, still one line (a local input, no cloud needed)
        (f"--input={images}", f"--output={tmp_path / 'out'}", "--jpeg_quality=0", "--runner=FnApiRunner"):
            "tpu-shards: error: --jpeg-quality 0 must be in 1..100",
    }
    for args, message in cases.items():
        done = run_main(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), (args, done.stderr)


def test_a_flex_launch_builds_the_job_for_the_worker_image_and_stages_no_package(gcs, tmp_path):
    """main.py with the launcher's argument shape (parameters as --name=value, Beam's --template_location
    for the job file) against the storage emulator: the job graph names the image, no sdist is staged,
    so workers install nothing at start-up."""
    write_images(tmp_path / "images", {"cat": 2, "dog": 2}, size=(32, 24))
    raw, out, tmp = gcs.new_bucket("flex-raw"), gcs.new_bucket("flex-out"), gcs.new_bucket("flex-tmp")
    gcs.upload_tree(tmp_path / "images", raw, "photos")
    job_file, image = tmp_path / "job_object.json", "europe-west4-docker.pkg.dev/p/r/tpu-shards:1"
    done = run_main(
        f"--input=gs://{raw}/photos", f"--output=gs://{out}/ds", "--num_cores=2", "--image_size=32",
        "--overwrite=false", "--project=local-emulator", "--region=europe-west4",
        f"--temp_location=gs://{tmp}/tmp", f"--staging_location=gs://{tmp}/staging",
        f"--template_location={job_file}", f"--sdk_container_image={image}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"template written to {job_file}" in done.stdout
    spec = json.loads(job_file.read_text())
    options = spec["environment"]["sdkPipelineOptions"]["options"]
    assert options["sdk_container_image"] == image and options["runner"] == "DataflowRunner"
    assert not options.get("setup_file") and not options.get("requirements_file")
    pools = spec["environment"]["workerPools"]
    harness = [h for pool in pools for h in pool["sdkHarnessContainerImages"]]
    assert harness and all(h["containerImage"] == image for h in harness)
    # The SDK that built the graph names its own base image: the one dataflow/Dockerfile starts from.
    instructions = dockerfile_instructions(DOCKERFILE)
    base = [expand(rest.split()[0], global_args(instructions)) for word, rest in instructions if word == "FROM"][-1]
    assert all(f"beam:version:sdk_base:{base}" in h["capabilities"] for h in harness)
    staged = [p["name"] for pool in pools for p in pool.get("packages", [])]
    assert not [n for n in staged if n.endswith((".tar.gz", ".whl", ".zip"))], staged  # nothing to pip install
    assert gcs.names(out) == []


# --- the image itself, only where a container engine answers -------------------------------------------

def container_engine() -> str | None:
    """Why no image can be built here, or None when `docker info` answers."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else f"docker info failed: {(done.stderr.strip().splitlines() or [''])[-1]}"


@pytest.mark.skipif(os.environ.get("TPU_SHARDS_SKIP_IMAGE_BUILD") == "1", reason="TPU_SHARDS_SKIP_IMAGE_BUILD=1")
def test_image_builds_and_its_launcher_entry_parses(tmp_path):
    reason = container_engine()
    if reason:
        pytest.skip(f"no container engine answers ({reason})")
    tag = "tpu-shards-flex-test:latest"
    built = subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(REPO)],
                           capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-3000:]
    probe = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c",
         "test -x /opt/google/dataflow/python_template_launcher && python /template/main.py --help "
         "&& python -c 'import apache_beam; print(apache_beam.__version__)'"],
        capture_output=True, text=True, timeout=600)
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "--image-size" in probe.stdout and probe.stdout.strip().endswith(apache_beam.__version__)
