/* Test program: loads the workload (built as a library exporting workload_main) the way
 * Python loads extension modules and PyTorch loads libcaffe2_nvrtc.so, with
 * dlopen(RTLD_LOCAL | RTLD_NOW).  The CUDA and NCCL libraries the workload depends on are
 * then in its local scope only, in no global one.  Usage: local_loader LIBRARY ARGS...
 * (ARGS as for workload); exits with the workload's status. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *lib = dlopen(argv[1], RTLD_LOCAL | RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    int (*workload_main)(int, char **) = (int (*)(int, char **))dlsym(lib, "workload_main");
    if (!workload_main) return 2;
    return workload_main(argc - 1, argv + 1);
}
