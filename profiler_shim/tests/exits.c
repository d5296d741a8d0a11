/* Test program: a process that ends, or replaces itself, without exit().
 * Usage: exits LAUNCHES HOW [PROGRAM ARGS...]
 * Launches LAUNCHES kernels with one key (f=0xe000, grid=(2,1,1), block=(64,1,1),
 * stream=0x700: one slot of the shim's per-thread cache holds all of them), keeps one
 * 1 MiB cudaMalloc live, prints "OK <pid>" (flushed: _exit skips stdio), then by HOW:
 *   return                       returns from main (the exit() path)
 *   _exit | _Exit                ends with that call
 *   fork | fork_exit             a forked child launches LAUNCHES kernels of as many
 *                                keys (f=0xe000+i: past 1024, keys meet in the cache's
 *                                slots) and returns (exit()) or calls _exit; the parent
 *                                waits and returns
 *   clone | clone_fn             the same child, made without the C library's fork (so
 *                                without pthread_atfork handlers): syscall(SYS_clone,
 *                                SIGCHLD) returning into main, which ends with exit(), or
 *                                clone(2) running a function on a stack of its own, whose
 *                                return ends it; the child also keeps a 2 MiB cudaMalloc
 *                                live, prints "CHILD <pid>" and the parent waits, returns
 *   clone_vm                     clone_fn's child made with CLONE_VM: a process of its own
 *                                in the parent's memory, with the parent's thread's TLS
 *                                (no CLONE_SETTLS), as a vfork child that goes on to CUDA
 *   fork_first                   forks before any CUDA call (the child _exits at once),
 *                                then goes on as return
 *   execv | execve | execvp | execvpe | fexecve | execveat | execl | execle | execlp
 *                                replaces itself with PROGRAM ARGS... by that call (the
 *                                l-forms take up to three ARGS)
 * and exits 1 when a call failed or the exec returned. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "hooks.h"

extern char **environ;

static int launch(long n, int keys) {
    for (long i = 0; i < n; i++)
        if (cuLaunchKernel((CUfunction)(0xe000 + (keys ? i : 0)), 2, 1, 1, 64, 1, 1, 0,
                           (CUstream)0x700, NULL, NULL) != CUDA_SUCCESS)
            return 1;
    return 0;
}

/* The child of a clone that is no C library fork: its own launches and memory. */
static int clone_child(long n) {
    void *q = NULL;
    if (launch(n, 1) || cudaMalloc(&q, 2 << 20) != cudaSuccess) return 1;
    printf("CHILD %ld\n", (long)getpid());
    fflush(stdout);
    return 0;
}

static int clone_fn(void *arg) { return clone_child(*(long *)arg); }

static int wait_for(pid_t child) {
    int status = 1;
    return child <= 0 || waitpid(child, &status, 0) != child || status != 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long n = atol(argv[1]);
    const char *how = argv[2];
    void *p = NULL;
    if (!strcmp(how, "fork_first")) {
        pid_t child = fork();
        if (child == 0) _exit(0);
        if (wait_for(child)) return 1;
        how = "return";
    }
    if (launch(n, 0) || cudaMalloc(&p, 1 << 20) != cudaSuccess) return 1;
    printf("OK %ld\n", (long)getpid());
    fflush(stdout);
    if (!strcmp(how, "return")) return 0;
    if (!strcmp(how, "_exit")) _exit(0);
    if (!strcmp(how, "_Exit")) _Exit(0);
    if (!strcmp(how, "fork") || !strcmp(how, "fork_exit")) {
        pid_t child = fork();
        if (child == 0 && !strcmp(how, "fork_exit")) _exit(launch(n, 1));
        if (child == 0) return launch(n, 1);
        int status = 1;
        return child < 0 || waitpid(child, &status, 0) != child || status != 0;
    }
    if (!strcmp(how, "clone")) {
        pid_t child = (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
        if (child == 0) exit(clone_child(n));
        return wait_for(child);
    }
    if (!strcmp(how, "clone_fn") || !strcmp(how, "clone_vm")) {
        static char stack[1 << 16] __attribute__((aligned(16)));
        int flags = SIGCHLD | (!strcmp(how, "clone_vm") ? CLONE_VM : 0);
        return wait_for(clone(clone_fn, stack + sizeof stack, flags, &n));
    }
    if (argc < 4) return 2;
    char **rest = argv + 3;
    const char *a1 = argc > 4 ? rest[1] : NULL, *a2 = argc > 5 ? rest[2] : NULL;
    const char *a3 = argc > 6 ? rest[3] : NULL;
    if (!strcmp(how, "execv")) execv(rest[0], rest);
    else if (!strcmp(how, "execve")) execve(rest[0], rest, environ);
    else if (!strcmp(how, "execvp")) execvp(rest[0], rest);
    else if (!strcmp(how, "execvpe")) execvpe(rest[0], rest, environ);
    else if (!strcmp(how, "fexecve")) {
        int fd = open(rest[0], O_RDONLY | O_CLOEXEC);
        if (fd >= 0) fexecve(fd, rest, environ);
    } else if (!strcmp(how, "execveat")) execveat(AT_FDCWD, rest[0], rest, environ, 0);
    else if (!strcmp(how, "execl")) execl(rest[0], rest[0], a1, a2, a3, (char *)NULL);
    else if (!strcmp(how, "execle")) execle(rest[0], rest[0], a1, a2, a3, (char *)NULL, environ);
    else if (!strcmp(how, "execlp")) execlp(rest[0], rest[0], a1, a2, a3, (char *)NULL);
    else return 2;
    perror(how);
    return 1;
}
