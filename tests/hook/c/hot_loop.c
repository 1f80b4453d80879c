/* The hot loop of the native-profiling tests' Python trainer (tests/hook/test_native.py,
 * tests/hook/scripts/native_trainer.py), built into a shared library with `cc` and called
 * through ctypes: pure arithmetic, so CPU samples land in this function. */
__attribute__((noinline)) unsigned long trainprof_hot_c_loop(unsigned long n) {
    volatile unsigned long acc = 1;
    for (unsigned long i = 0; i < n; i++) acc = acc * 6364136223846793005UL + i;
    return acc;
}
