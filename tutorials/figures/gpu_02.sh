#!/usr/bin/env bash
# Chapter 2's CPU-versus-GPU measurements (Hegde & Usmani 2016, section 4) and the CuPy tests, on a
# machine with a CUDA GPU, CuPy, PyTorch and the test dependencies installed. Run from the
# repository root:  bash tutorials/figures/gpu_02.sh OUTDIR
# It writes OUTDIR/gpu_tests.txt (the tests' CuPy variants), OUTDIR/train_{numpy,cupy}.jsonl (one
# allreduce-SGD run on each backend, same seed) and OUTDIR/02_<suite>_gpu.json for each
# suite in $SUITES (default "layers sweep conv"; python -m minidl.bench <suite>: CPU rows on one
# thread, GPU rows on CuPy, each beside PyTorch on the same device). Copy the JSON files to
# tutorials/figures/out/ and run make_02_figures.py --only gpu to render chapter 2's GPU tables from them.
set -u -o pipefail
out=${1:?usage: bash tutorials/figures/gpu_02.sh OUTDIR}
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import cupy, numpy, torch; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)" \
    | tee -a "$out/gpu.txt"
if [ "${TESTS:-1}" = 1 ]; then      # TESTS=0: the benchmarks only
timeout 240 python3 -m pytest -q -p no:cacheprovider -k cupy -rs \
    tests/test_backend.py tests/test_autograd.py tests/test_layers.py tests/test_conv_algorithms.py \
    tests/test_persistent.py tests/test_collectives.py 2>&1 | tee "$out/gpu_tests.txt"
echo "tests: exit $?" | tee -a "$out/gpu.txt"
# one training run per backend, the same seed: the per-epoch losses should agree to float32 rounding
for b in numpy cupy; do
    MINIDL_BACKEND=$b timeout 120 mpiexec -n 2 python3 -m algorithms.allreduce_sgd --model cnn --epochs 2 \
        --quiet --log "$out/train_$b.jsonl"; echo "train on $b: exit $?" | tee -a "$out/gpu.txt"
done
fi
for suite in ${SUITES:-layers sweep conv}; do
    timeout 300 python3 -m minidl.bench "$suite" --repeats "${REPEATS:-7}" --json "$out/02_${suite}_gpu.json" 2>&1 \
        | tee "$out/$suite.txt"
done
