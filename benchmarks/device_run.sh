#!/usr/bin/env bash
# The build's scaling over 1 to 16 workers and the JAX iterator feeding an accelerator, in one bounded run on a
# machine with no network (a lent GPU machine): each log and table is written under $OUT as it goes, so a run cut
# short still leaves what it measured.
#
#   OUT=/tmp/out WHL=.whl benchmarks/device_run.sh
#
# WHL: wheels the machine lacks (Beam and what a build imports, grain, array-record), installed with
# `pip --no-index --no-deps` into $SITE; made on a machine with network, for that machine's Python, with
# `pip download --no-deps --only-binary=:all: --python-version 3.12 ...` (docs/performance.md, "On 16 cores").
# Sizes: BUILD_COUNT (4000 images per build), BUILD_WORKERS (1,2,4,8,16), JAX_IMAGES (1024), JAX_ROUNDS (2),
# JAX_THREADS (make_iterator also with threads=N for each N of this list, e.g. 16,32; default none),
# BUDGET_S (560 s in all: the JAX candidates get at most JAX_S of it, 70, Grain's worker processes JAX_MP_S, 45 (0:
# not run), and the build benchmark what is left: it needed about 360 s at 4000 images on 16 vCPUs).
set -u -o pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${OUT:-/tmp/device_run}
WHL=${WHL:-.whl}
SITE=${SITE:-/tmp/site}
WORK=${WORK:-/tmp/device_work}
BUILD_COUNT=${BUILD_COUNT:-4000}
BUILD_WORKERS=${BUILD_WORKERS:-1,2,4,8,16}
JAX_IMAGES=${JAX_IMAGES:-1024}
JAX_ROUNDS=${JAX_ROUNDS:-2}
JAX_S=${JAX_S:-70}
JAX_MP_S=${JAX_MP_S:-45}
JAX_THREADS=${JAX_THREADS:-}
BUDGET_S=${BUDGET_S:-560}
START=$SECONDS
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2

say() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - START))s] $*" | tee -a "$OUT/steps.log"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }

if compgen -G "$WHL/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
        2>&1 | tee "$OUT/install.log" || { say "STOP: the wheels in $WHL did not install"; exit 3; }
    # byte-compiled once here, or every worker process of the first builds compiles the same modules at once
    "$PY" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
    export PYTHONPATH="$PWD:$SITE"
else
    export PYTHONPATH="$PWD"
fi

{
    echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo); $(uname -m) Linux $(uname -r)"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); memory: $(free -g | awk '/Mem/ {print $2 " GiB"}')"
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
    "$PY" - <<'EOF'
import platform
from importlib import metadata
names = ("apache-beam", "numpy", "pillow", "protobuf", "pyarrow", "grpcio", "jax", "jaxlib", "grain", "array-record",
         "orbax-checkpoint", "fastavro", "google-crc32c")
def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
print("Python", platform.python_version(), "|", ", ".join(f"{n} {version(n)}" for n in names))
EOF
} 2>&1 | tee "$OUT/env.log"

say "smoke test: a 16-image build and its verify"
"$PY" - "$WORK" <<'EOF' 2>&1 | tee "$OUT/smoke.log"
import sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from build_bench import data
print(data.input_folder(Path(sys.argv[1]), "jpg", 16, 4))
EOF
if ! { "$PY" -m beam_jobs.cli build --input "$WORK/inputs/jpg-16" --output "$WORK/smoke" --overwrite --no-progress \
        --workers 2 && "$PY" -m beam_jobs.cli verify "$WORK/smoke"; } 2>&1 | tee -a "$OUT/smoke.log"; then
    say "STOP: the 16-image build failed (see smoke.log): a missing wheel or import; nothing else was run"
    exit 4
fi

say "JAX: make_iterator against Grain's pipelines (at most ${JAX_S} + ${JAX_MP_S} s)"
if "$PY" -c "import jax, grain, array_record; print(jax.devices())" 2>&1 | tee "$OUT/jax.log"; then
    jax_args=(--data "$WORK/jax" --images "$JAX_IMAGES" --batches 16 --warmup 16)
    threads=()
    [ -n "$JAX_THREADS" ] && threads=(--threads "$JAX_THREADS")
    timeout -k 5 "$JAX_S" "$PY" benchmarks/bench_jax.py "${jax_args[@]}" --rounds "$JAX_ROUNDS" --only make_iterator \
        --only "make_iterator, resumed" --only "Grain threads" "${threads[@]}" 2>&1 | tee -a "$OUT/jax.log"
    # Grain's worker processes apart, bounded on their own: on the H200 machine they gave no batch in 40 s
    if [ "$JAX_MP_S" -gt 0 ]; then
        timeout -k 5 "$JAX_MP_S" "$PY" benchmarks/bench_jax.py "${jax_args[@]}" --rounds 1 --only make_iterator \
            --only "Grain mp_prefetch" 2>&1 | tee "$OUT/jax_mp.log"
    fi
else
    say "JAX, grain or array_record does not import: the JAX part is skipped"
fi

budget=$(($(left) - 10))
say "build scaling: --count $BUILD_COUNT --workers $BUILD_WORKERS (at most ${budget} s)"
timeout -k 5 "$budget" "$PY" benchmarks/bench_build.py --count "$BUILD_COUNT" --workers "$BUILD_WORKERS" --no-tfds \
    --big-factor 0 --work "$WORK/build" 2>&1 | tee "$OUT/build.log"
status=$?
tar -czf "$OUT/build_logs.tar.gz" -C "$WORK/build" logs 2>/dev/null  # each timed build's result, if cut short
say "done (build benchmark exit $status)"
