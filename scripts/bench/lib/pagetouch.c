// SPDX-License-Identifier: Apache-2.0
// Which pages of its own binary a process touches, in order, at 4 KB
// (fault-around, which maps 64 KB per fault, hides this from RSS).
// LD_PRELOAD: every page of the executable's text mapping starts PROT_NONE;
// the first touch faults, is recorded with the faulting instruction, and
// gets its protection back. Read-only data is left alone: a syscall handed
// a pointer into a PROT_NONE page fails with EFAULT instead of faulting
// (a static "READY=1" sent to NOTIFY_SOCKET did), which would change what
// the traced process does. SIGUSR2 writes the records so
// far to $PAGETOUCH_OUT as "file-offset-of-page ip-vaddr prot" lines.
// Used by scripts/bench/startup-order.py only; never shipped.
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

struct range { uintptr_t start, end, off; int prot; };
static struct range ranges[16];
static int nranges;
static uintptr_t base;
struct rec { uintptr_t page, ip; int kind; };
#define MAXREC (1 << 20)
static struct rec recs[MAXREC];
static volatile int nrec;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < nranges; i++) {
        if (a >= ranges[i].start && a < ranges[i].end) {
            uintptr_t page = a & ~(uintptr_t)4095;
            mprotect((void *)page, 4096, ranges[i].prot);
            int n = __atomic_fetch_add(&nrec, 1, __ATOMIC_RELAXED);
            if (n < MAXREC) {
                recs[n].page = page - ranges[i].start + ranges[i].off;
                recs[n].ip = ((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP];
                recs[n].kind = ranges[i].prot;
            }
            return;
        }
    }
    signal(SIGSEGV, SIG_DFL);
}

static void on_usr2(int sig) {
    const char *out = getenv("PAGETOUCH_OUT");
    int fd = open(out ? out : "/tmp/pagetouch.out", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char line[128];
    int n = nrec < MAXREC ? nrec : MAXREC;
    for (int i = 0; i < n; i++) {
        int len = snprintf(line, sizeof line, "%lx %lx %d\n", (unsigned long)recs[i].page,
                           (unsigned long)(recs[i].ip - base), recs[i].kind);
        write(fd, line, len);
    }
    close(fd);
}

__attribute__((constructor)) static void init(void) {
    char exe[4096];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l < 0) return;
    exe[l] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long s, e, off; char perms[5]; char path[4096] = "";
        if (sscanf(line, "%lx-%lx %4s %lx %*s %*s %4095s", &s, &e, perms, &off, path) < 4) continue;
        if (strcmp(path, exe)) continue;
        if (off == 0) base = s;  /* the load address: ip - base is a vaddr */
        if (perms[2] != 'x' || nranges == 16) continue;
        ranges[nranges++] = (struct range){s, e, off, PROT_READ | PROT_EXEC};
    }
    if (f) fclose(f);
    struct sigaction sa = {0};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, 0);
    signal(SIGUSR2, on_usr2);
    for (int i = 0; i < nranges; i++)
        mprotect((void *)ranges[i].start, ranges[i].end - ranges[i].start, PROT_NONE);
}
