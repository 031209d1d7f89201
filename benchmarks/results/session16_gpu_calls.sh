#!/usr/bin/env bash
# Session 16's GPU calls (nvidia-h100-x1), each run as `bash .gpu/s16callN.sh $OUT` from the repository
# root with build/libtorch_offload.so and build/_save_hooks.cpython-312-x86_64-linux-gnu.so carried
# (the GPU machine's Python is 3.12: the C save hooks were built for it here with
# cmake -S . -B /tmp/build-py312 -DPython3_EXECUTABLE=/root/.pyenv/versions/3.12.1/bin/python3 ...
# --target torch_offload_save_hooks, then copied into build/).

# Call 1: the C save hooks load on the GPU machine; CUDA tests; C against Python hooks in one process.
s16call1() {
ROOT=$PWD
export TORCH_OFFLOAD_LIBRARY=$ROOT/build/libtorch_offload.so PYTHONPATH=$ROOT
python3 -c "import sys, torch; from torch_offload import _library; print(sys.version); print('C save hooks:', _library.load_save_hooks())"
(cd python_tests && timeout 300 python3 -m pytest -q -p no:cacheprovider -m cuda test_first_restores.py test_selective.py \
  test_save_hooks_c.py test_activations.py test_activations_dedup.py test_modules.py test_save_filter.py \
  test_keep_on_device.py test_layers.py)   # gpu_pytest_cuda_h100_session16_call1.log
python3 benchmarks/results/save_hooks_ab.py 4096 6 modules,all   # save_hooks_ab_4k_h100.log
python3 benchmarks/results/save_hooks_ab.py 16384 2 modules      # save_hooks_ab_16k_h100.log
}

# Call 2: is the 4k modules forward bound by the host?
s16call2() {
python3 benchmarks/results/modules_forward_bound_4k.py 4096 8   # modules_forward_bound_4k_h100.log
}

# Call 3: py-spy over the 4k modules loop with the C hooks (the alternating script's first version
# failed here: apply() returns the OffloadHandle, whose .modules holds the hooks).
s16call3() {
pip install -q --no-deps .whl/py_spy-0.4.3-py2.py3-none-manylinux1_x86_64.manylinux_2_5_x86_64.whl
python3 benchmarks/results/modules_loop_4k.py 300 > modules_loop_4k_c_hooks_h100.log &
sleep 25
py-spy record --native --format raw --rate 100 -d 15 --pid $! -o modules_4k_c_hooks_pyspy_h100.txt
}

# Call 4 (run twice: the first run's "none" set had no filter to reset): the leaf check in C.
s16call4() {
(cd python_tests && python3 -m pytest -q -p no:cacheprovider -m cuda test_save_filter.py test_save_hooks_c.py \
  test_activations_dedup.py test_modules.py)                          # gpu_pytest_cuda_h100_session16_call4.log
python3 benchmarks/results/modules_hooks_alternating_4k.py 4096 60   # modules_hooks_alternating_4k_h100.log
}

# Call 5 (carry .whl/trl-1.16.0-py3-none-any.whl): the final build.
s16call5() {
python3 -m pip install -q --no-deps --no-index .whl/trl-1.16.0-py3-none-any.whl
(cd python_tests && python3 -m pytest -q -p no:cacheprovider -m cuda test_save_hooks_c.py test_save_filter.py \
  test_activations.py test_modules.py test_layers.py)                 # gpu_pytest_cuda_h100_session16_call5.log
python3 benchmarks/bench_modules.py --out $OUT/mod --seqs 4096,16384 --steps 5 --rounds 6               # modules_c_hooks_h100.*
python3 benchmarks/bench_activations.py --out $OUT/act --seqs 16384 --variants none,all,trl --no-noise \
  --soak-steps 2 --warmup 1 --steps 3                                                                     # activations_c_hooks_16k_h100.*
python3 benchmarks/bench_activations.py --out $OUT/noise --seqs 4096 --variants none,all,modules --steps 3 \
  --warmup 1 --soak-steps 2                                                                               # noise_c_hooks_4k_h100.*
}

# Call 6: issue 10's comparisons step by step (see the README row: not valid for selective).
s16call6() {
python3 benchmarks/results/stepwise_issue10.py 4096 40 ckpt,hidden,hidden_nocopy,selective,selective_re   # stepwise_issue10_4k_h100.log
python3 benchmarks/results/stepwise_issue10.py 16384 12 ckpt,hidden,hidden_nocopy,selective               # stepwise_issue10_16k_h100.log
python3 benchmarks/results/stepwise_issue10.py 32768 6 ckpt,hidden,hidden_nocopy,selective                # stepwise_issue10_32k_h100.log
}

# Call 7: the 4k modules forward decomposed (no save hooks, bare Python hooks, C hooks keeping
# every save, C hooks, Python hooks), step by step.
s16call7() {
python3 benchmarks/results/modules_hooks_alternating_4k.py 4096 40 all   # modules_hooks_decomposed_4k_h100.log
}

# Call 8 (library built with session15_fence_poll_experiment.patch applied): spinning against polling.
s16call8() {
python3 benchmarks/results/modules_hooks_alternating_4k.py 4096 40 poll  # modules_fence_poll_4k_h100.log
}

# Call 9 (library built with session16_save_path_timing.patch applied; run twice, the first run
# with 60 steps only had the first step's pinned allocations in its totals): the save path by section.
s16call9() {
python3 benchmarks/results/modules_loop_4k.py 40 2> save_path_timing_4k_40_h100.log
python3 benchmarks/results/modules_loop_4k.py 140 2> save_path_timing_4k_140_h100.log
}

# Call 10: issue 10's comparisons step by step, one model copy per variant.
s16call10() {
python3 benchmarks/results/stepwise_models_issue10.py 4096 40 ckpt,ckpt_re,hidden,selective,selective_re   # stepwise_models_issue10_4k_h100.log
python3 benchmarks/results/stepwise_models_issue10.py 16384 12 ckpt,hidden,selective                       # stepwise_models_issue10_16k_h100.log
python3 benchmarks/results/stepwise_models_issue10.py 32768 6 ckpt,hidden,selective                        # stepwise_models_issue10_32k_h100.log
}

# Call 11: layer offloading's first figures.
s16call11() {
python3 benchmarks/bench_layers.py --out $OUT/layers   # layers_session16_h100.*
}

# Call 12: after the review, the CUDA cases of the save-hook files.
s16call12() {
(cd python_tests && python3 -m pytest -q -p no:cacheprovider -m cuda test_save_hooks_c.py test_save_filter.py \
  test_activations.py test_activations_dedup.py test_modules.py test_layers.py)   # gpu_pytest_cuda_h100_session16_call12.log
}
