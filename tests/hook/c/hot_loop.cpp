/* The C++ hot loop of tests/hook/test_native.py: the same arithmetic as hot_loop.c, inside
 * a namespaced C++ member function (mangled `_ZN14trainprof_test7HotLoop3runEm`), behind the
 * same `extern "C"` entry point, so that the trainer (tests/hook/scripts/native_trainer.py)
 * loads either library. The profile must name it demangled:
 * `trainprof_test::HotLoop::run(unsigned long)`. */
namespace trainprof_test {
struct HotLoop {
    __attribute__((noinline)) static unsigned long run(unsigned long n) {
        volatile unsigned long acc = 1;
        for (unsigned long i = 0; i < n; i++) acc = acc * 6364136223846793005UL + i;
        return acc;
    }
};
}  // namespace trainprof_test

extern "C" __attribute__((noinline)) unsigned long trainprof_hot_c_loop(unsigned long n) {
    return trainprof_test::HotLoop::run(n);
}
