/* A native backtrace when a process crashes, for machines without gdb (the GPU machine):
 * LD_PRELOAD=segv_backtrace.so python ...  prints the crashing thread's frames to stderr
 * (each as library(+offset from the library's base), for addr2line, then as backtrace_symbols
 * names it), then lets the signal kill the process as before.
 * Python's faulthandler, installed later, dumps the Python stack first and then re-raises
 * into this handler. Built and used by scripts/crash_probe.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void print_backtrace(int sig) {
  static const char header[] = "native backtrace (segv_backtrace):\n";
  void* frames[64];
  const int count = backtrace(frames, 64);
  (void)sig;
  if (write(2, header, sizeof header - 1) < 0) return;
  /* dladdr and snprintf are not async-signal-safe; the process is ending anyway. */
  for (int i = 0; i < count; ++i) {
    Dl_info info;
    char line[1024];
    if (dladdr(frames[i], &info) == 0 || info.dli_fname == NULL) continue;
    const int n = snprintf(line, sizeof line, "%s(+0x%lx)\n", info.dli_fname,
                           (unsigned long)((char*)frames[i] - (char*)info.dli_fbase));
    if (n > 0 && write(2, line, (size_t)n) < 0) return;
  }
  backtrace_symbols_fd(frames, count, 2);
}

static void on_fatal_signal(int sig) {
  print_backtrace(sig);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_fatal_signal;
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGSEGV, &action, 0);
  sigaction(SIGBUS, &action, 0);
  sigaction(SIGILL, &action, 0);
  sigaction(SIGFPE, &action, 0);
  sigaction(SIGABRT, &action, 0); /* std::terminate, failed assertions */
}
